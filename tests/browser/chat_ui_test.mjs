// The server's chat page (server/ui/chat.html) driven in Debian's headless Chromium against a
// real moeserve server: it loads cleanly, streams the same answer as the API, Stop aborts the
// request on the server, a wrong key shows an error, the Server tab shows live numbers.
//
// Env: CHAT_UI_URL (server serving the page at / and the API), CHAT_UI_API_KEY (its key),
//      CHAT_UI_MODEL (served model name), CHAT_UI_SCREENSHOT (PNG to write).
// Run: node --test-reporter=spec chat_ui_test.mjs   (next to node_modules with playwright-core)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const BASE = (process.env.CHAT_UI_URL || '').replace(/\/+$/, '');
const KEY = process.env.CHAT_UI_API_KEY || '';
const MODEL = process.env.CHAT_UI_MODEL || 'default';
const SCREENSHOT = process.env.CHAT_UI_SCREENSHOT || path.join(os.tmpdir(), 'moeserve_chat_ui.png');
const PROMPT = 'And it came to pass';
// Generous: the machine has 2 cores, maybe shared with a build.
const ANSWER_TIMEOUT_MS = 60_000;

let browser;
let page;
const consoleErrors = [];   // console messages of type error, as "text (url)"
const pageErrors = [];      // uncaught exceptions in the page

before(async () => {
  assert.ok(BASE, 'CHAT_UI_URL must name the server, e.g. http://127.0.0.1:8000');
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  page.setDefaultTimeout(30_000);
  page.on('console', (msg) => {
    if (msg.type() === 'error') consoleErrors.push(`${msg.text()} (${msg.location().url || 'page'})`);
  });
  page.on('pageerror', (error) => pageErrors.push(String(error && error.stack || error)));
});

after(async () => {
  if (browser) await browser.close();
});

// ---------- helpers ----------

async function metricsText() {
  const response = await fetch(`${BASE}/metrics`);
  assert.equal(response.status, 200, `GET /metrics answered ${response.status}`);
  return response.text();
}

// The finished_reason="abort" count of vllm:request_success_total, summed over engines.
async function abortCount() {
  let total = 0;
  for (const line of (await metricsText()).split('\n')) {
    if (line.startsWith('vllm:request_success_total{') && line.includes('finished_reason="abort"')) {
      total += Number(line.trim().split(/\s+/).pop());
    }
  }
  return total;
}

async function setField(selector, value) {
  await page.fill(selector, String(value));
}

// Settings used by every chat here: greedy, short, seeded, no system prompt.
async function setSettings({ key = KEY, maxTokens = 24 } = {}) {
  await setField('#api-key', key);
  await setField('#temperature', 0);
  await setField('#max-tokens', maxTokens);
  await setField('#seed', 0);
  await setField('#system-prompt', '');
}

async function sendMessage(text) {
  await page.fill('#message-input', text);
  await page.click('#send');
}

const lastAnswer = () => page.locator('.message.assistant').last();

// Waits until the last answer's data-state is `state`; the failure says what it was instead.
async function waitForAnswerState(state, timeout = ANSWER_TIMEOUT_MS, hint = '') {
  try {
    await page.waitForFunction((want) => {
      const all = document.querySelectorAll('.message.assistant');
      return all.length > 0 && all[all.length - 1].dataset.state === want;
    }, state, { timeout });
  } catch (error) {
    const answer = lastAnswer();
    const seen = (await answer.count()) === 0 ? 'no answer at all'
      : `data-state="${await answer.getAttribute('data-state')}", text ${JSON.stringify(await answer.innerText())}`;
    assert.fail(`expected the answer to reach data-state="${state}" within ${timeout} ms; saw ${seen}` +
                (hint ? ` (${hint})` : ''));
  }
}

// The same request the page makes, sent by the test without streaming.
async function referenceAnswer(messages, { maxTokens, topP }) {
  const body = { model: MODEL, messages, temperature: 0, max_tokens: maxTokens, seed: 0, stream: false };
  if (topP !== '') body.top_p = Number(topP);
  const response = await fetch(`${BASE}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  assert.equal(response.status, 200, `reference request answered ${response.status}: ${text}`);
  return JSON.parse(text);
}

// ---------- tests ----------

test('the page loads without errors and shows the model name', async () => {
  const response = await page.goto(`${BASE}/`, { waitUntil: 'load' });
  assert.equal(response.status(), 200, `GET / answered ${response.status()}`);
  assert.match(response.headers()['content-type'] || '', /^text\/html/, 'GET / is not text/html');
  assert.equal(await page.title(), 'moeserve');
  const configText = await page.locator('#moeserve-config').textContent();
  assert.ok(!configText.includes('__MOESERVE_CONFIG__'), 'the server left the config placeholder in the page');
  assert.doesNotThrow(() => JSON.parse(configText), `the page's config is not JSON: ${configText}`);
  assert.equal((await page.locator('#model-name').innerText()).trim(), MODEL, 'the model name shown');
  await page.waitForTimeout(300);   // let late errors of the first scripts arrive
  assert.deepEqual(consoleErrors, [], 'console errors while loading');
  assert.deepEqual(pageErrors, [], 'page errors while loading');
});

test('a streamed answer equals the API answer for the same request', { timeout: 120_000 }, async () => {
  await setSettings();
  await sendMessage(PROMPT);
  await waitForAnswerState('done');
  const shown = await lastAnswer().locator('.content').textContent();
  const topP = await page.inputValue('#top-p');
  const reference = await referenceAnswer([{ role: 'user', content: PROMPT }], { maxTokens: 24, topP });
  const expected = reference.choices[0].message.content;
  assert.ok(expected.length > 0, 'the reference answer is empty');
  assert.equal(shown, expected, 'the page shows the same text as the non-streamed answer');
  const stats = await lastAnswer().locator('.stats').innerText();
  const tokens = stats.match(/(\d+) tokens?/);
  assert.ok(tokens, `the stats line shows no token count: ${JSON.stringify(stats)}`);
  assert.equal(Number(tokens[1]), reference.usage.completion_tokens,
               `the stats line's token count (${stats}) vs the API's usage`);
  assert.match(stats, /TTFT \d+ ms/, `the stats line shows no TTFT: ${JSON.stringify(stats)}`);
  assert.deepEqual(pageErrors, [], 'page errors while chatting');
});

test('Stop keeps the partial answer and the server counts an abort', { timeout: 120_000 }, async () => {
  await page.click('#new-chat');
  assert.equal(await page.locator('.message').count(), 0, 'New chat left messages in the view');
  const abortsBefore = await abortCount();
  // A long answer (greedy on this prompt does not meet EOS soon) so that Stop comes first.
  await setSettings({ maxTokens: 1000 });
  await sendMessage(PROMPT);
  await page.waitForFunction(() => {
    const all = document.querySelectorAll('.message.assistant');
    const last = all[all.length - 1];
    return last && last.querySelector('.content').textContent.length > 0;
  }, null, { timeout: ANSWER_TIMEOUT_MS, polling: 'raf' });
  // If the answer ended first (EOS, or a model so fast that 1000 tokens take no time), #stop is
  // hidden again: say so rather than time out on the click.
  const tooLate = 'the answer ended before Stop: this test needs a model that keeps generating ' +
                  'for a while at temperature 0 on its prompt';
  try {
    await page.click('#stop', { timeout: 5_000 });
  } catch {
    assert.fail(`could not click #stop; the answer's data-state is ` +
                `"${await lastAnswer().getAttribute('data-state')}": ${tooLate}`);
  }
  await waitForAnswerState('stopped', 15_000, tooLate);
  const partial = await lastAnswer().locator('.content').textContent();
  assert.ok(partial.length > 0, 'the partial answer did not stay after Stop');
  assert.ok(await page.isHidden('#stop'), '#stop still shown after the answer stopped');

  let abortsNow = abortsBefore;
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    abortsNow = await abortCount();
    if (abortsNow >= abortsBefore + 1) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  assert.equal(abortsNow, abortsBefore + 1,
               `vllm:request_success_total{finished_reason="abort"} was ${abortsBefore} before Stop; ` +
               `expected ${abortsBefore + 1} within 10 s, saw ${abortsNow}`);
  assert.deepEqual(pageErrors, [], 'page errors after Stop');
});

test('the JSON schema box makes every answer JSON valid under it', { timeout: 120_000 }, async () => {
  await page.click('#new-chat');
  await setSettings({ maxTokens: 200 });
  await setField('#temperature', 1);
  const schema = { type: 'object', properties: { answer: { type: 'string', maxLength: 12 },
                                                  sure: { type: 'boolean' } },
                   required: ['answer', 'sure'] };
  await setField('#json-schema', JSON.stringify(schema));
  await sendMessage(PROMPT);
  await waitForAnswerState('done');
  const shown = await lastAnswer().locator('.content').textContent();
  let value;
  assert.doesNotThrow(() => { value = JSON.parse(shown); }, `the answer is not JSON: ${shown}`);
  assert.equal(typeof value.answer, 'string', shown);
  assert.ok([...value.answer].length <= 12, shown);
  assert.equal(typeof value.sure, 'boolean', shown);
  assert.deepEqual(Object.keys(value).sort(), ['answer', 'sure'], shown);
  // Not JSON: an error in the page, nothing sent.
  await setField('#json-schema', '{"type": ');
  await sendMessage(PROMPT);
  const error = page.locator('.message.error').last();
  await error.waitFor({ state: 'visible', timeout: 10_000 });
  assert.match(await error.innerText(), /JSON schema/);
  await setField('#json-schema', '');
  await page.click('#new-chat');
});

test('a wrong API key shows the 401 as an error message',
     { timeout: 60_000, skip: !KEY && 'no CHAT_UI_API_KEY: the server takes any key' }, async () => {
  await page.click('#new-chat');
  await setSettings({ key: 'wrong-key' });
  await sendMessage(PROMPT);
  const error = page.locator('.message.error').last();
  await error.waitFor({ state: 'visible', timeout: 30_000 });
  const text = await error.innerText();
  assert.match(text, /401/, `the error message does not mention 401: ${JSON.stringify(text)}`);
  assert.match(text, /unauthori[sz]ed|api key/i, `the error message does not say why: ${JSON.stringify(text)}`);
  assert.equal(await lastAnswer().getAttribute('data-state'), 'error');
  // A 401 makes Chromium log "Failed to load resource": expected here, so only page errors count.
  assert.deepEqual(pageErrors, [], 'page errors after the 401');
  await setField('#api-key', KEY);
});

test('the Server tab shows live numbers', { timeout: 60_000 }, async () => {
  await page.click('#tab-server');
  await page.waitForTimeout(1_500);
  const ids = ['#metric-running', '#metric-waiting', '#metric-kv', '#metric-aborts'];
  const NUMBER = '^-?[\\d,]+(\\.\\d+)?\\s*%?$';   // "0", "1,234", "3.1 %"
  try {
    await page.waitForFunction(([list, pattern]) => list.every((id) => new RegExp(pattern).test(
      document.querySelector(id).textContent.trim())), [ids, NUMBER], { timeout: 10_000 });
  } catch {
    const seen = {};
    for (const id of ids) seen[id] = await page.locator(id).innerText();
    const banner = await page.locator('#metrics-error').innerText().catch(() => '');
    assert.fail(`expected numbers in ${ids.join(', ')}; saw ${JSON.stringify(seen)} ${banner}`);
  }
  for (const id of ids) assert.match((await page.locator(id).innerText()).trim(), new RegExp(NUMBER), id);
  const aborts = Number((await page.locator('#metric-aborts').innerText()).replace(/,/g, ''));
  assert.ok(aborts >= 1, `#metric-aborts shows ${aborts}, but the Stop test aborted a request`);
  assert.ok(await page.isHidden('#metrics-error'), 'the Server tab shows a metrics error');
  assert.deepEqual(pageErrors, [], 'page errors on the Server tab');
});

test('screenshot of a conversation with one finished answer', { timeout: 120_000 }, async () => {
  await page.click('#tab-chat');
  await page.click('#new-chat');
  await setSettings();
  await sendMessage(PROMPT);
  await waitForAnswerState('done');
  assert.equal(await page.locator('.message.assistant').count(), 1);
  await page.screenshot({ path: SCREENSHOT });
  console.log(`screenshot: ${SCREENSHOT}`);
  assert.deepEqual(pageErrors, [], 'page errors');
});
