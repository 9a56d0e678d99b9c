// app.js - the hotmoe page: a streaming chat (fetch + SSE parsing) and the live experts view
// (layers x experts heatmap from GET /experts, hit rates, tok/s from GET /metrics).
// No framework, no build step: the server embeds this file as it is.
'use strict';

const $ = (id) => document.getElementById(id);
const state = {
  history: [],        // chat messages sent so far
  chat: true,         // false: the model has no chat template, use /v1/completions
  abort: null,
  experts: null,
  hitSeries: [],      // [{t, hit, tps}]
  lastTok: null,
};

const keyInput = $('apikey');
keyInput.value = localStorage.getItem('hotmoe.apikey') || '';
keyInput.addEventListener('change', () => { localStorage.setItem('hotmoe.apikey', keyInput.value); poll(); });

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (keyInput.value) h['Authorization'] = 'Bearer ' + keyInput.value;
  return h;
}

async function api(path, opts = {}) {
  const res = await fetch(path, { ...opts, headers: headers(!!opts.body) });
  const ct = res.headers.get('Content-Type') || '';
  const body = ct.includes('json') ? await res.json() : await res.text();
  if (!res.ok) {
    const msg = body && body.error ? body.error.message : String(body);
    throw Object.assign(new Error(msg), { status: res.status });
  }
  return body;
}

// ---- chat ----

function addMsg(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  const span = document.createElement('span');
  span.className = 'text';
  span.textContent = text;
  div.appendChild(span);
  $('log').appendChild(div);
  $('log').scrollTop = $('log').scrollHeight;
  return div;
}

// Read an SSE body: call onData(json) for each `data:` event until [DONE].
async function readSSE(res, onData) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of ev.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  const maxTokens = parseInt($('maxtok').value, 10) || 128;
  const temperature = parseFloat($('temp').value);
  addMsg('user', text);
  const out = addMsg('assistant', '');
  const span = out.querySelector('.text');
  const meta = document.createElement('span');
  meta.className = 'meta';
  out.appendChild(meta);
  let body, path;
  if (state.chat) {
    state.history.push({ role: 'user', content: text });
    path = '/v1/chat/completions';
    body = { messages: state.history, stream: true, max_tokens: maxTokens, temperature };
  } else {
    path = '/v1/completions';
    body = { prompt: text, stream: true, max_tokens: maxTokens, temperature };
  }
  state.abort = new AbortController();
  $('send').disabled = true;
  $('stop').disabled = false;
  const t0 = performance.now();
  let n = 0, reply = '', finish = '';
  try {
    const res = await fetch(path, { method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: state.abort.signal });
    if (!res.ok) {
      const e = await res.json().catch(() => null);
      throw new Error(e && e.error ? e.error.message : 'HTTP ' + res.status);
    }
    await readSSE(res, (j) => {
      if (j.error) throw new Error(j.error.message);
      const c = j.choices && j.choices[0];
      if (!c) return;
      const piece = state.chat ? (c.delta && c.delta.content) : c.text;
      if (c.finish_reason) finish = c.finish_reason;
      else out.dataset.chunks = String(++n);
      if (piece) {
        reply += piece;
        span.textContent = reply;
        $('log').scrollTop = $('log').scrollHeight;
      }
    });
    const s = (performance.now() - t0) / 1000;
    meta.textContent = `${n} tokens, ${(n / s).toFixed(1)} tok/s, ${finish || 'done'}`;
    if (state.chat) state.history.push({ role: 'assistant', content: reply });
  } catch (e) {
    if (e.name === 'AbortError') meta.textContent = `${n} tokens, stopped`;
    else { out.classList.add('error'); span.textContent = reply + (reply ? '\n' : '') + 'error: ' + e.message; }
    if (state.chat) state.history.push({ role: 'assistant', content: reply });
  } finally {
    state.abort = null;
    $('send').disabled = false;
    $('stop').disabled = true;
  }
}

$('form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = $('input').value;
  if (!text.trim() || state.abort) return;
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('form').requestSubmit(); }
});
$('stop').addEventListener('click', () => state.abort && state.abort.abort());
$('clear').addEventListener('click', () => { state.history = []; $('log').textContent = ''; });

// ---- experts view ----

function heatColor(v) { // v in [0, 1]
  const stops = [[0x16, 0x20, 0x2c], [0x2b, 0x5f, 0x8f], [0xff, 0xb1, 0x3d], [0xff, 0xf1, 0xc9]];
  const x = Math.max(0, Math.min(1, v)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  const c = stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}
const tierColor = { vram: '#ffb13d', ram: '#4da3ff', ssd: '#8a93a3' };

function drawHeat() {
  const cv = $('heat'), g = cv.getContext('2d');
  const ex = state.experts;
  const nl = ex ? ex.n_layer : 0, ne = ex ? ex.n_expert : 0;
  g.fillStyle = '#0d1014';
  g.fillRect(0, 0, cv.width, cv.height);
  if (!nl || !ne) return;
  const padL = 34, padT = 16, w = cv.width - padL - 4, h = cv.height - padT - 4;
  const cw = w / ne, ch = h / nl;
  g.font = '10px system-ui';
  g.fillStyle = '#8a93a3';
  for (let l = 0; l < nl; l += Math.max(1, Math.ceil(nl / 16))) g.fillText(String(l), 4, padT + (l + 0.75) * ch);
  for (let e = 0; e < ne; e += Math.max(1, Math.ceil(ne / 16))) g.fillText(String(e), padL + e * cw, 11);
  const layers = ex.layers || [];
  for (let l = 0; l < nl; l++) {
    const L = layers[l] || {};
    const counts = L.counts || [];
    let max = 0;
    for (const c of counts) max = Math.max(max, c);
    const lm = Math.log1p(max);
    for (let e = 0; e < ne; e++) {
      const c = counts[e] || 0;
      g.fillStyle = heatColor(lm > 0 ? Math.log1p(c) / lm : 0);
      g.fillRect(padL + e * cw + 0.5, padT + l * ch + 0.5, Math.max(1, cw - 1), Math.max(1, ch - 1));
      const tier = L.tier && L.tier[e];
      if (tier && tier !== 'ram' && cw >= 3 && ch >= 3) {
        g.strokeStyle = tierColor[tier] || '#fff';
        g.lineWidth = Math.min(2, cw / 4);
        if (tier === 'ssd') g.setLineDash([2, 2]); else g.setLineDash([]);
        g.strokeRect(padL + e * cw + 1, padT + l * ch + 1, cw - 2, ch - 2);
      }
    }
  }
  g.setLineDash([]);
  cv.dataset.drawn = String(nl * ne);
}

function drawBars(cv, values) {
  const g = cv.getContext('2d');
  g.fillStyle = '#0d1014';
  g.fillRect(0, 0, cv.width, cv.height);
  g.strokeStyle = '#2a303b';
  g.strokeRect(0.5, 0.5, cv.width - 1, cv.height - 1);
  if (!values.length) { g.fillStyle = '#8a93a3'; g.font = '11px system-ui'; g.fillText('no data yet', 8, 18); return; }
  const bw = cv.width / values.length;
  values.forEach((v, i) => {
    const hgt = (cv.height - 8) * Math.max(0, Math.min(1, v));
    g.fillStyle = '#4da3ff';
    g.fillRect(i * bw + 1, cv.height - hgt, Math.max(1, bw - 2), hgt);
  });
}

function drawSeries(cv, pts) {
  const g = cv.getContext('2d');
  g.fillStyle = '#0d1014';
  g.fillRect(0, 0, cv.width, cv.height);
  g.strokeStyle = '#2a303b';
  g.strokeRect(0.5, 0.5, cv.width - 1, cv.height - 1);
  if (pts.length < 2) return;
  const maxTps = Math.max(1, ...pts.map((p) => p.tps));
  const line = (key, scale, color) => {
    g.beginPath();
    g.strokeStyle = color;
    pts.forEach((p, i) => {
      const v = p[key];
      if (v == null) return;
      const x = (i / (pts.length - 1)) * (cv.width - 4) + 2;
      const y = cv.height - 4 - (cv.height - 8) * (v / scale);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  };
  line('hit', 1, '#4da3ff');
  line('tps', maxTps, '#ff7a3d');
  g.fillStyle = '#8a93a3';
  g.font = '10px system-ui';
  g.fillText(`hit rate (blue), tok/s (orange, max ${maxTps.toFixed(1)})`, 6, 12);
}

$('heat').addEventListener('mousemove', (ev) => {
  const ex = state.experts;
  if (!ex || !ex.n_layer) return;
  const cv = $('heat'), r = cv.getBoundingClientRect();
  const x = (ev.clientX - r.left) * cv.width / r.width, y = (ev.clientY - r.top) * cv.height / r.height;
  const e = Math.floor((x - 34) / ((cv.width - 38) / ex.n_expert)), l = Math.floor((y - 16) / ((cv.height - 20) / ex.n_layer));
  if (e < 0 || l < 0 || e >= ex.n_expert || l >= ex.n_layer) return;
  const L = (ex.layers || [])[l] || {};
  $('cellinfo').textContent = `layer ${l}, expert ${e}: ${(L.counts || [])[e] || 0} tokens, tier ${(L.tier || [])[e] || 'ram'}`;
});

function parseMetrics(text) {
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const i = line.lastIndexOf(' ');
    m[line.slice(0, i)] = parseFloat(line.slice(i + 1));
  }
  return m;
}

/* The GPU placement in one line: slots used per device, peer units, prefill streaming so far. */
function gpuText(ex) {
  const g = ex.gpu;
  if (!g || !g.devices || !g.devices.length) return '';
  const devs = g.devices.map((d) => `GPU ${d.ordinal} ${d.slots_used}/${d.slots} slots` + (d.peer ? ` (${d.peer} peer)` : '')).join(', ');
  const st = g.prefill_stream && g.prefill_stream.units ? `, ${g.prefill_stream.units} units streamed in prefill` : '';
  const pin = g.pinned_bytes ? `, ${(g.pinned_bytes / 2 ** 30).toFixed(2)} GiB pinned for direct copies (${g.direct_fills} made)` : '';
  return ` · ${devs}${st}${pin}`;
}

async function poll() {
  try {
    const [ex, mt, slots] = await Promise.all([api('/experts'), api('/metrics'), api('/slots')]);
    state.experts = ex;
    const m = parseMetrics(mt);
    const tps = m['hotmoe_predicted_tokens_per_second'] || 0;
    $('tps').textContent = tps.toFixed(1);
    $('ntok').textContent = String(m['hotmoe_tokens_predicted_total'] || 0);
    $('slots').textContent = String(slots.length);
    $('busy').textContent = String(slots.filter((s) => s.is_processing).length);
    const hits = (ex.layers || []).map((L) => L.hit_rate).filter((v) => typeof v === 'number');
    const hit = typeof ex.hit_rate === 'number' ? ex.hit_rate : hits.length ? hits.reduce((a, b) => a + b, 0) / hits.length : null;
    state.hitSeries.push({ t: Date.now(), hit, tps });
    if (state.hitSeries.length > 120) state.hitSeries.shift();
    $('estatus').textContent = ex.available
      ? `${ex.n_layer} layers × ${ex.n_expert} experts, k ${ex.n_expert_used}, ${ex.tokens} tokens, policy ${ex.policy || '-'}` +
        gpuText(ex) + (ex.mlocked_bytes ? ` · experts locked in RAM (${(ex.mlocked_bytes / 2 ** 30).toFixed(2)} GiB)` : '')
      : `${ex.n_layer} layers × ${ex.n_expert} experts, k ${ex.n_expert_used} — ${ex.note || 'no usage counts yet'}`;
    const sel = $('policy');
    if (!sel.options.length) for (const p of ex.policies || []) sel.add(new Option(p, p));
    if (ex.policy) sel.value = ex.policy;
    drawHeat();
    drawBars($('hitlayer'), hits);
    drawSeries($('hittime'), state.hitSeries);
  } catch (e) {
    $('estatus').textContent = e.status === 401 ? 'enter the API key (top right)' : 'cannot reach the server: ' + e.message;
  }
}

$('save').addEventListener('click', async () => {
  try { const r = await api('/profile/save', { method: 'POST', body: '{}' }); $('msg').textContent = 'profile written to ' + r.path; }
  catch (e) { $('msg').textContent = e.message; }
});
$('apply').addEventListener('click', async () => {
  try {
    const r = await api('/experts/policy', { method: 'POST', body: JSON.stringify({ policy: $('policy').value }) });
    $('msg').textContent = 'policy: ' + r.policy;
  } catch (e) { $('msg').textContent = e.message; }
});

async function init() {
  try {
    const props = await api('/props');
    state.chat = !!props.chat_template;
    $('model').textContent = `${props.model.id} · ${props.model.meta.arch} · ctx ${props.default_generation_settings.n_ctx}`;
    $('mode').textContent = state.chat ? '(chat template: ' + (props.chat_template_name || 'custom') + ')' : '(no chat template: plain completion)';
  } catch (e) {
    $('model').textContent = e.status === 401 ? 'enter the API key (top right)' : 'server unreachable';
  }
  drawHeat();
  poll();
  setInterval(poll, 1000);
}
init();
