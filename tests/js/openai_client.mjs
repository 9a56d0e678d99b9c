// openai_client.mjs - `hotmoe serve` driven by the official `openai` npm client (tests/cli_server_openai.sh
// starts the server with --parallel 4 --api-key KEY --chat-template chatml): chat (plain and streamed,
// the streamed deltas equal to the plain greedy text, usage counts), legacy completions (plain and
// streamed), models.list, another model name served by the loaded model, errors surfaced as APIError
// subclasses with the right status (400 malformed params / prompt over the context, 401 wrong key),
// 4 concurrent streaming clients
// whose greedy outputs equal the same requests run alone, and a client that aborts mid-stream
// (AbortController) leaving its slot free again (GET /slots).
// Usage: node openai_client.mjs BASE_URL API_KEY MODEL_ID      (BASE_URL like http://127.0.0.1:PORT)
import OpenAI from 'openai';

const [base, key, modelId] = process.argv.slice(2);
if (!base || !key || !modelId) {
  console.log('usage: node openai_client.mjs BASE_URL API_KEY MODEL_ID');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });

let passed = 0, failed = 0;
const check = (cond, what, detail) => {
  if (cond) { passed++; return true; }
  failed++;
  console.log(`FAIL: ${what}${detail !== undefined ? ` (${typeof detail === 'string' ? detail : JSON.stringify(detail)})` : ''}`);
  return false;
};
const step = async (name, fn) => {
  try { await fn(); } catch (e) { check(false, `${name}: threw`, String(e && e.stack || e)); }
};

const raw = async (path) => {
  const r = await fetch(base + path, { headers: { Authorization: `Bearer ${key}` } });
  return r.headers.get('content-type')?.includes('json') ? r.json() : r.text();
};
const metric = async (re) => {
  const m = (await raw('/metrics')).split('\n').find((l) => re.test(l));
  return m ? Number(m.trim().split(/\s+/).pop()) : NaN;
};
const busySlots = async () => (await raw('/slots')).filter((s) => s.is_processing).length;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Extra fields the server understands (llama-server's) pass through the client's body untouched.
const chatReq = (content, extra = {}) => ({
  model: modelId,
  messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content }],
  max_tokens: 48, temperature: 0, seed: 42, ...extra,
});
const streamText = async (stream, field) => {
  let text = '', chunks = 0, finish = null, usage = null, ids = new Set();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    chunks++;
    text += field === 'chat' ? (c.delta?.content ?? '') : (c.text ?? '');
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, chunks, finish, usage, ids };
};
const usageOk = (u, maxTokens, what) => {
  check(u && u.prompt_tokens > 0, `${what}: usage.prompt_tokens > 0`, u);
  check(u && u.completion_tokens > 0 && u.completion_tokens <= maxTokens, `${what}: 0 < usage.completion_tokens <= max_tokens`, u);
  check(u && u.total_tokens === u.prompt_tokens + u.completion_tokens, `${what}: total = prompt + completion`, u);
};

// ---- models.list ----
await step('models.list', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  check(ids.length === 1 && ids[0] === modelId, 'models.list: the one model', ids);
  const page = await client.models.list();
  check(page.data[0]?.object === 'model' && page.data[0]?.owned_by === 'hotmoe', 'models.list: model object', page.data[0]);
});

// ---- chat, non-streaming and streaming ----
let chatPlain = null;
await step('chat', async () => {
  const r = await client.chat.completions.create(chatReq('Say hello to the experts.'));
  chatPlain = r;
  check(r.object === 'chat.completion', 'chat: object', r.object);
  check(r.model === modelId, 'chat: model echoed', r.model);
  check(r.choices.length === 1 && r.choices[0].message.role === 'assistant', 'chat: one assistant choice', r.choices);
  check(typeof r.choices[0].message.content === 'string' && r.choices[0].message.content.length > 0,
        'chat: choices[0].message.content non-empty', r.choices[0].message);
  check(['stop', 'length'].includes(r.choices[0].finish_reason), 'chat: finish_reason', r.choices[0].finish_reason);
  usageOk(r.usage, 48, 'chat');
  if (r.choices[0].finish_reason === 'length') check(r.usage.completion_tokens === 48, 'chat: length => max_tokens tokens', r.usage);
  // Same request again: greedy is deterministic.
  const r2 = await client.chat.completions.create(chatReq('Say hello to the experts.'));
  check(r2.choices[0].message.content === r.choices[0].message.content, 'chat: repeat gives the same greedy text');
  // withResponse exposes the raw HTTP status/headers through the client.
  const { response } = await client.chat.completions.create(chatReq('hi', { max_tokens: 2 })).withResponse();
  check(response.status === 200 && /json/.test(response.headers.get('content-type')), 'chat: 200 JSON response');
});

await step('chat stream', async () => {
  const stream = await client.chat.completions.create({ ...chatReq('Say hello to the experts.'), stream: true,
                                                         stream_options: { include_usage: true } });
  const s = await streamText(stream, 'chat');
  check(s.chunks > 1, 'chat stream: several chunks', s.chunks);
  check(s.ids.size === 1, 'chat stream: one id across chunks', [...s.ids]);
  check(chatPlain && s.text === chatPlain.choices[0].message.content, 'chat stream: concatenated deltas = non-streaming greedy text',
        { stream: s.text, plain: chatPlain?.choices[0].message.content });
  check(chatPlain && s.finish === chatPlain.choices[0].finish_reason, 'chat stream: same finish_reason', s.finish);
  check(chatPlain && s.usage && s.usage.completion_tokens === chatPlain.usage.completion_tokens &&
        s.usage.prompt_tokens === chatPlain.usage.prompt_tokens, 'chat stream: usage = non-streaming usage', s.usage);
  // Seeded sampling: same seed -> same stream text, plain or streamed.
  const sampled = chatReq('Pick a number.', { temperature: 0.9, top_p: 0.95, seed: 1234, max_tokens: 32 });
  const p = await client.chat.completions.create(sampled);
  const q = await streamText(await client.chat.completions.create({ ...sampled, stream: true }), 'chat');
  check(q.text === p.choices[0].message.content, 'chat stream: seeded sampling = non-streaming with the same seed');
  // stop strings end the text before the stop string.
  const full = chatPlain?.choices[0].message.content ?? '';
  // A stop string from the middle of the greedy text: two printable ASCII characters after the start.
  const m = /[!-~]{2}/.exec(full.slice(3));
  const stopAt = m ? m[0] : null;
  if (check(stopAt && full.indexOf(stopAt) > 0, 'chat: a stop string can be picked from the greedy text', full)) {
    const st = await client.chat.completions.create(chatReq('Say hello to the experts.', { stop: [stopAt] }));
    check(st.choices[0].finish_reason === 'stop' && !st.choices[0].message.content.includes(stopAt) &&
          full.startsWith(st.choices[0].message.content), 'chat: stop string', { stopAt, got: st.choices[0].message.content });
  }
});

// ---- legacy completions ----
await step('completions', async () => {
  const req = { model: modelId, prompt: 'The expert store keeps', max_tokens: 40, temperature: 0 };
  const r = await client.completions.create(req);
  check(r.object === 'text_completion', 'completions: object', r.object);
  check(typeof r.choices[0].text === 'string' && r.choices[0].text.length > 0, 'completions: text non-empty', r.choices[0]);
  usageOk(r.usage, 40, 'completions');
  const s = await streamText(await client.completions.create({ ...req, stream: true }), 'completions');
  check(s.text === r.choices[0].text, 'completions stream: concatenated text = non-streaming', { stream: s.text, plain: r.choices[0].text });
});

// ---- errors surface as APIError with the right status ----
const expectErr = async (what, status, Cls, fn, pred = () => true) => {
  try {
    await fn();
    check(false, `${what}: no error thrown`);
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: APIError`, String(e));
    check(e.status === status, `${what}: status ${status}`, e.status);
    check(e instanceof Cls, `${what}: ${Cls.name}`, e.constructor?.name);
    check(typeof e.error?.message === 'string' && e.error.message.length > 0 && pred(e), `${what}: OpenAI error object`, e.error);
  }
};
await step('errors', async () => {
  // one model is loaded: another name (a client's own default) is served by it, named in the answer
  const other = await client.chat.completions.create({ ...chatReq('x'), model: 'gpt-9', max_tokens: 2 });
  check(other.model === modelId && other.choices.length === 1, 'another model name (chat): served by the loaded model', other.model);
  const otherC = await client.completions.create({ model: 'gpt-9', prompt: 'x', max_tokens: 2 });
  check(otherC.model === modelId, 'another model name (completions): served by the loaded model', otherC.model);
  await expectErr('temperature of the wrong type', 400, OpenAI.BadRequestError,
    () => client.chat.completions.create(chatReq('x', { temperature: 'hot' })), (e) => e.param === 'temperature');
  await expectErr('negative max_tokens', 400, OpenAI.BadRequestError,
    () => client.completions.create({ model: modelId, prompt: 'x', max_tokens: -5 }), (e) => e.param === 'max_tokens');
  await expectErr('messages not an array', 400, OpenAI.BadRequestError,
    () => client.chat.completions.create({ model: modelId, messages: 'hi' }), (e) => e.param === 'messages');
  await expectErr('unknown role', 400, OpenAI.BadRequestError,
    () => client.chat.completions.create({ model: modelId, messages: [{ role: 'wizard', content: 'x' }] }));
  await expectErr('prompt over the context', 400, OpenAI.BadRequestError,
    () => client.completions.create({ model: modelId, prompt: Array(5000).fill(65) }), (e) => e.code === 'context_length_exceeded');
  const wrong = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'not-the-key', maxRetries: 0 });
  await expectErr('wrong API key', 401, OpenAI.AuthenticationError,
    () => wrong.chat.completions.create(chatReq('x')), (e) => e.code === 'invalid_api_key');
  await expectErr('wrong API key (models.list)', 401, OpenAI.AuthenticationError, () => wrong.models.list());
  // a sampled first token may be end-of-text (an empty, stopped completion): that is still an answer
  const r = await client.completions.create({ model: modelId, prompt: 'still there?', max_tokens: 2 });
  check(r.choices.length === 1 && ['stop', 'length'].includes(r.choices[0].finish_reason) &&
    r.usage.completion_tokens <= 2 && (r.choices[0].finish_reason === 'stop' || r.usage.completion_tokens === 2),
  'still serving after the errors', r);
});

// ---- 4 concurrent streaming clients = the same requests alone ----
await step('concurrent', async () => {
  const prompts = ['Alpha beta gamma', 'Zebra yak', 'Tell me about mixtures of experts', 'One two three four'];
  const reqs = prompts.map((p, i) => chatReq(p, { max_tokens: 300 + 50 * i, ignore_eos: true, seed: i }));
  const alone = [];
  for (const r of reqs) alone.push((await client.chat.completions.create(r)).choices[0].message.content);
  const rounds0 = await metric(/^hotmoe_decode_rounds_total /), tok0 = await metric(/^hotmoe_tokens_predicted_total /);
  // Separate clients (own connection pools), started together.
  const clients = reqs.map(() => new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 }));
  let maxBusy = 0, done = false;
  const watcher = (async () => { while (!done) { maxBusy = Math.max(maxBusy, await busySlots()); await sleep(5); } })();
  const outs = await Promise.all(reqs.map(async (r, i) =>
    streamText(await clients[i].chat.completions.create({ ...r, stream: true }), 'chat')));
  done = true;
  await watcher;
  const rounds1 = await metric(/^hotmoe_decode_rounds_total /), tok1 = await metric(/^hotmoe_tokens_predicted_total /);
  outs.forEach((o, i) => {
    check(o.finish === 'length', `concurrent ${i}: ran to max_tokens`, o.finish);
    check(o.text === alone[i], `concurrent ${i}: streamed greedy text = the request alone`);
  });
  console.log(`concurrent: ${tok1 - tok0} tokens in ${rounds1 - rounds0} rounds, up to ${maxBusy} slots busy at once`);
  check(rounds1 - rounds0 < tok1 - tok0, 'concurrent: streams shared decode rounds', { rounds: rounds1 - rounds0, tokens: tok1 - tok0 });
  check(maxBusy >= 2, 'concurrent: several slots busy at once', maxBusy);
});

// ---- a client that aborts mid-stream frees its slot ----
await step('abort', async () => {
  const cancelled0 = await metric(/^hotmoe_requests_total\{outcome="cancelled"\}/);
  let aborted = false, got = 0, finish = null;
  for (let attempt = 0; attempt < 3 && !aborted; attempt++) {
    const ac = new AbortController();
    const stream = await client.chat.completions.create(
      chatReq('Go on forever', { max_tokens: 3500, ignore_eos: true, stream: true }), { signal: ac.signal });
    got = 0;
    finish = null;
    try {
      for await (const chunk of stream) {
        if (chunk.choices[0]?.finish_reason) { finish = chunk.choices[0].finish_reason; break; }
        if (ac.signal.aborted) continue;
        if (++got === 5) {
          check(await busySlots() === 1, 'abort: the slot is busy while streaming');
          ac.abort();
        }
      }
      // The client's stream iterator ends quietly when its signal aborts (it does not throw).
      aborted = ac.signal.aborted && finish === null;
    } catch (e) {
      aborted = e instanceof OpenAI.APIUserAbortError || e?.name === 'AbortError';
      if (!aborted) throw e;
    }
  }
  if (!check(aborted, 'abort: the stream was aborted mid-way', { got, finish })) return;
  let freedMs = -1;
  for (let t = 0; t < 2000; t += 20) {
    if (await busySlots() === 0) { freedMs = t; break; }
    await sleep(20);
  }
  console.log(`abort: slot free again after ~${freedMs} ms`);
  check(freedMs >= 0 && freedMs <= 1000, 'abort: slot free again within 1 s', freedMs);
  const slots = await raw('/slots');
  check(Math.max(...slots.map((s) => s.n_cached)) < 3500, 'abort: generation stopped early', slots.map((s) => s.n_cached));
  const cancelled1 = await metric(/^hotmoe_requests_total\{outcome="cancelled"\}/);
  check(cancelled1 > cancelled0, 'abort: counted as cancelled', { cancelled0, cancelled1 });
  const r = await client.chat.completions.create(chatReq('after the abort', { max_tokens: 4 }));
  check(r.choices[0].message.content.length > 0, 'abort: serving after the abort');
});

console.log(`openai client: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
