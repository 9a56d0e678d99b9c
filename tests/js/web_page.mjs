// web_page.mjs - the hotmoe page in real headless Chromium (Debian's /usr/bin/chromium driven by
// playwright-core): it loads, takes the API key, a chat message streams an answer (the reply text
// changes several times before the stream ends), and the experts heatmap canvas is drawn.
// Usage: node web_page.mjs URL API_KEY SCREENSHOT.png     (tests/cli_web.sh starts the server)
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [url, key, shot] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), 'hotmoe-chromium-'));
let failures = 0, checks = 0;
const check = (cond, what) => { checks++; if (!cond) { failures++; console.log('FAIL: ' + what); } };

const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1400, height: 900 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync'],
});
try {
  const page = ctx.pages()[0] || await ctx.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(url, { waitUntil: 'load' });
  check((await page.title()) === 'hotmoe', 'page title');
  // Without the key the page says so; with it, it loads the model.
  await page.waitForFunction(() => /API key/.test(document.getElementById('model').textContent), null, { timeout: 10000 });
  await page.fill('#apikey', key);
  await page.dispatchEvent('#apikey', 'change');
  await page.reload({ waitUntil: 'load' });
  await page.waitForFunction(() => /qwen3moe/.test(document.getElementById('model').textContent), null, { timeout: 10000 });
  check(/chatml/.test(await page.textContent('#mode')), 'chat mode with the ChatML template');

  // Count how often the reply's text changes while it streams.
  await page.evaluate(() => {
    window.__updates = 0;
    new MutationObserver(() => { window.__updates++; })
      .observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
  });
  await page.fill('#maxtok', '48');
  await page.fill('#temp', '0');
  await page.fill('#input', 'Hello, who are you?');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.msg.user');
  await page.waitForFunction(() => {
    const m = document.querySelector('.msg.assistant .meta');
    return m && /tokens/.test(m.textContent);
  }, null, { timeout: 30000 });
  const reply = await page.textContent('.msg.assistant .text');
  const meta = await page.textContent('.msg.assistant .meta');
  const updates = await page.evaluate(() => window.__updates);
  console.log(`reply: ${JSON.stringify(reply).slice(0, 120)} (${meta}), ${updates} DOM updates`);
  check(reply.length > 0, 'streamed text appeared');
  check(!(await page.$('.msg.error')), 'no error message');
  const chunks = Number(await page.getAttribute('.msg.assistant', 'data-chunks'));
  check(chunks === Number((meta.match(/^(\d+) tokens/) || [])[1]) && chunks > 1, `one SSE chunk per token (${chunks}, ${meta})`);
  check(updates >= 2, `the reply was drawn as it arrived (${updates} updates)`);

  // The heatmap: drawn, and not just background.
  await page.waitForFunction(() => Number(document.getElementById('heat').dataset.drawn || 0) > 0, null, { timeout: 10000 });
  const px = await page.evaluate(() => {
    const cv = document.getElementById('heat');
    const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i] !== 0x0d || d[i + 1] !== 0x10 || d[i + 2] !== 0x14) n++;
    return { n, cells: Number(cv.dataset.drawn) };
  });
  console.log(`heatmap: ${px.cells} cells, ${px.n} painted pixels`);
  check(px.cells === 32, 'heatmap has layers x experts = 4 x 8 cells');
  check(px.n > 10000, 'heatmap painted');
  await page.waitForFunction(() => document.getElementById('ntok').textContent !== '0', null, { timeout: 5000 });
  check(Number(await page.textContent('#slots')) === 1, 'slots shown');
  if (shot) await page.screenshot({ path: shot, fullPage: true });
  check(errors.length === 0, 'no page errors: ' + errors.join('; '));
} catch (e) {
  failures++;
  console.log('FAIL: ' + e.message);
} finally {
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(`${checks - failures >= 0 ? checks - failures : 0} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
