// End-to-end tests of a running `moeserve serve` through the official OpenAI Node client: every
// response goes through the client's own parsing, streaming and error classes, and what it
// returns is compared with `moeserve generate --json` (greedy, same prompt ids) where a
// reference exists. run.sh starts the server and passes, in the environment:
//   OPENAI_TEST_URL          http://127.0.0.1:PORT
//   OPENAI_TEST_API_KEY      the server's --api-key
//   OPENAI_TEST_MOESERVE     the moeserve binary (for the `generate` references)
//   OPENAI_TEST_MODEL        the model folder the server serves
//   OPENAI_TEST_MAX_MODEL_LEN the server's --max-model-len
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test as nodeTest } from 'node:test';

import OpenAI, {
  APIError,
  AuthenticationError,
  BadRequestError,
  NotFoundError,
} from 'openai';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (run this through run.sh)`);
  return value;
};
const URL_BASE = env('OPENAI_TEST_URL');
const API_KEY = env('OPENAI_TEST_API_KEY');
const MOESERVE = env('OPENAI_TEST_MOESERVE');
const MODEL_DIR = env('OPENAI_TEST_MODEL');
const MAX_MODEL_LEN = Number(env('OPENAI_TEST_MAX_MODEL_LEN'));
const SERVED = 'tiny';

const client = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });

const PROMPT = [5, 17, 42, 99, 3, 250, 7];
const MESSAGES = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'Tell me a story' },
];

const show = (v) => JSON.stringify(v);

// Each case gets a minute: a hung request fails its case instead of the whole run's timeout.
const test = (name, fn) => nodeTest(name, { timeout: 60_000 }, fn);

// deepStrictEqual with the two values in the message.
function eq(actual, expected, what) {
  assert.deepStrictEqual(actual, expected, `${what}: got ${show(actual)}, want ${show(expected)}`);
}
function near(actual, expected, what, tol = 1e-4) {
  assert.ok(
    typeof actual === 'number' && Math.abs(actual - expected) <= tol,
    `${what}: got ${show(actual)}, want ${show(expected)} (± ${tol})`,
  );
}
function ok(cond, what, value) {
  assert.ok(cond, value === undefined ? what : `${what}: ${show(value)}`);
}

// `moeserve generate --json` of prompt ids, greedy unless `extra` says otherwise: the reference
// the server must match. The first (or only) choice's record, or all of them with all = true.
function generate(ids, maxTokens, extra = [], all = false) {
  const args = ['generate', '--model', MODEL_DIR, '--token-ids', ids.join(','),
    '--max-tokens', String(maxTokens), '--ignore-eos', '--json', ...extra];
  let out;
  try {
    out = execFileSync(MOESERVE, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    throw new Error(`moeserve ${args.join(' ')} failed: ${e.stderr ?? e.message}`);
  }
  const requests = JSON.parse(out).requests;
  return all ? requests : requests[0];
}

// The server's own (non-OpenAI) routes, outside /v1.
async function postRaw(path, body) {
  const r = await fetch(URL_BASE + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  assert.equal(r.status, 200, `POST ${path} ${show(body)}: status ${r.status}, body ${text}`);
  return JSON.parse(text);
}
const tokenizeChat = async (messages) => (await postRaw('/tokenize', { messages })).tokens;
const detokenize = async (ids) => (await postRaw('/detokenize', { tokens: ids })).prompt;

// Unicode code points of a string (Python's len, which vLLM's text_offset counts).
const codePoints = (s) => [...s].length;

// A request that must succeed right after an error: the server is still serving.
async function stillServing() {
  const r = await client.completions.create({ model: SERVED, prompt: PROMPT, max_tokens: 2 });
  eq(r.choices.length, 1, 'choices after an error');
  eq(r.usage.completion_tokens, 2, 'completion_tokens after an error');
}

test('models.list() lists the served model', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  eq(ids, [SERVED], 'model ids');
  const m = page.data[0];
  eq(m.object, 'model', 'object');
  eq(m.owned_by, 'vllm', 'owned_by');
  ok(Number.isInteger(m.created), 'created is an integer', m.created);
  eq(m.max_model_len, MAX_MODEL_LEN, 'max_model_len (vLLM extra field)');
  // The auto-paginating iterator too.
  const seen = [];
  for await (const model of client.models.list()) seen.push(model.id);
  eq(seen, [SERVED], 'iterated model ids');
});

test('completions.create (token-id prompt, greedy) equals moeserve generate', async () => {
  const ref = generate(PROMPT, 12);
  const r = await client.completions.create({
    model: SERVED, prompt: PROMPT, max_tokens: 12, temperature: 0,
    ignore_eos: true, // vLLM extra: the client sends unknown body keys as they are
  });
  eq(r.object, 'text_completion', 'object');
  ok(r.id.startsWith('cmpl-'), 'id starts with cmpl-', r.id);
  eq(r.model, SERVED, 'model');
  ok(Number.isInteger(r.created), 'created is an integer', r.created);
  eq(r.choices.length, 1, 'choices');
  eq(r.choices[0].index, 0, 'index');
  eq(r.choices[0].text, ref.text, 'text vs generate');
  eq(r.choices[0].finish_reason, 'length', 'finish_reason');
  eq(r.usage, {
    prompt_tokens: PROMPT.length,
    completion_tokens: ref.token_ids.length,
    total_tokens: PROMPT.length + ref.token_ids.length,
    // Shorter than a GDN state checkpoint's 64 tokens: nothing can come from the prefix cache.
    prompt_tokens_details: { cached_tokens: 0 },
  }, 'usage');
  eq(ref.token_ids.length, 12, 'generate token count');
});

test('streaming completion concatenates to the non-stream text; usage in a last, choice-less chunk', async () => {
  const request = { model: SERVED, prompt: PROMPT, max_tokens: 16, temperature: 0, ignore_eos: true };
  const whole = await client.completions.create(request);
  const ref = generate(PROMPT, 16);
  eq(whole.choices[0].text, ref.text, 'non-stream text vs generate');

  const stream = await client.completions.create({
    ...request, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  // Tokens that arrive together may share a chunk: one content chunk at least, then usage.
  ok(chunks.length >= 2, 'content chunks and the usage chunk', chunks.length);
  let text = '';
  const finishes = [];
  for (const c of chunks.slice(0, -1)) {
    eq(c.object, 'text_completion', 'chunk object');
    eq(c.id, chunks[0].id, 'chunk id');
    eq(c.choices.length, 1, 'chunk choices');
    text += c.choices[0].text;
    if (c.choices[0].finish_reason != null) finishes.push(c.choices[0].finish_reason);
    ok(c.usage == null, 'no usage before the last chunk', c);
  }
  eq(text, whole.choices[0].text, 'concatenated stream text vs non-stream text');
  eq(finishes, ['length'], 'finish_reasons over the stream');
  const last = chunks.at(-1);
  eq(last.choices, [], 'choices of the last chunk');
  eq(last.usage, whole.usage, 'usage of the last chunk vs non-stream usage');
});

test('chat.completions.create, non-stream and stream, equals moeserve generate', async () => {
  const ids = await tokenizeChat(MESSAGES);
  ok(ids.length > 0, 'chat prompt ids', ids);
  const ref = generate(ids, 12);
  const request = { model: SERVED, messages: MESSAGES, max_tokens: 12, temperature: 0, ignore_eos: true };

  const whole = await client.chat.completions.create(request);
  eq(whole.object, 'chat.completion', 'object');
  ok(whole.id.startsWith('chatcmpl-'), 'id starts with chatcmpl-', whole.id);
  eq(whole.model, SERVED, 'model');
  eq(whole.choices.length, 1, 'choices');
  eq(whole.choices[0].index, 0, 'index');
  eq(whole.choices[0].message.role, 'assistant', 'role');
  eq(whole.choices[0].message.content, ref.text, 'content vs generate');
  eq(whole.choices[0].finish_reason, 'length', 'finish_reason');
  eq(whole.usage, {
    prompt_tokens: ids.length, completion_tokens: 12, total_tokens: ids.length + 12,
    prompt_tokens_details: { cached_tokens: 0 },
  }, 'usage');

  const stream = await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  ok(chunks.length >= 2, 'content chunks and the usage chunk', chunks.length);
  const content = chunks.slice(0, -1);
  eq(content[0].choices[0].delta.role, 'assistant', 'role of the first delta');
  let text = '';
  const finishes = [];
  for (const c of content) {
    eq(c.object, 'chat.completion.chunk', 'chunk object');
    eq(c.id, chunks[0].id, 'chunk id');
    text += c.choices[0].delta.content ?? '';
    if (c.choices[0].finish_reason != null) finishes.push(c.choices[0].finish_reason);
  }
  eq(text, whole.choices[0].message.content, 'concatenated deltas vs non-stream content');
  eq(finishes, ['length'], 'finish_reasons over the stream');
  eq(chunks.at(-1).choices, [], 'choices of the usage chunk');
  eq(chunks.at(-1).usage, whole.usage, 'usage chunk vs non-stream usage');
});

test('chat.completions.stream() helper assembles the same completion', async () => {
  const request = { model: SERVED, messages: MESSAGES, max_tokens: 10, temperature: 0, ignore_eos: true };
  const whole = await client.chat.completions.create(request);
  const runner = client.chat.completions.stream({ ...request, stream_options: { include_usage: true } });
  let deltas = '';
  runner.on('content', (delta) => { deltas += delta; });
  const final = await runner.finalChatCompletion();
  eq(final.choices[0].message.content, whole.choices[0].message.content, 'assembled content');
  eq(final.choices[0].message.role, 'assistant', 'assembled role');
  eq(final.choices[0].finish_reason, 'length', 'assembled finish_reason');
  eq(deltas, whole.choices[0].message.content, "'content' events");
  eq(final.usage, whole.usage, 'assembled usage');
});

test('completions logprobs: 3 equals generate --logprobs 3', async () => {
  const n = 6;
  const ref = generate(PROMPT, n, ['--logprobs', '3']);
  const r = await client.completions.create({
    model: SERVED, prompt: PROMPT, max_tokens: n, temperature: 0, ignore_eos: true, logprobs: 3,
  });
  const lp = r.choices[0].logprobs;
  ok(lp != null && typeof lp === 'object', 'logprobs object', r.choices[0]);
  for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) {
    eq(lp[key]?.length, n, `length of logprobs.${key}`);
  }
  eq(r.choices[0].text, ref.text, 'text vs generate');
  for (let i = 0; i < n; ++i) {
    const want = ref.logprobs[i];
    eq(lp.tokens[i], await detokenize([ref.token_ids[i]]), `tokens[${i}] (id ${ref.token_ids[i]})`);
    ok(lp.token_logprobs[i] <= 0, `token_logprobs[${i}] <= 0`, lp.token_logprobs[i]);
    near(lp.token_logprobs[i], want.logprob, `token_logprobs[${i}] vs generate`);
    const top = lp.top_logprobs[i];
    ok(top && typeof top === 'object' && !Array.isArray(top), `top_logprobs[${i}] is an object`, top);
    for (const v of Object.values(top)) ok(v <= 0, `top_logprobs[${i}] values <= 0`, top);
    // vLLM's dict {decoded token: logprob} over the top 3 by rank: tokens that decode alike
    // (say to U+FFFD) share a key, the later (less likely) one's value winning.
    const expected = {};
    for (const t of want.top) expected[await detokenize([t.token])] = t.logprob;
    eq(Object.keys(top).sort(), Object.keys(expected).sort(),
      `top_logprobs[${i}] keys (generate's top ids ${show(want.top.map((t) => t.token))})`);
    for (const [k, v] of Object.entries(expected)) near(top[k], v, `top_logprobs[${i}][${show(k)}] vs generate`);
    // Greedy: the sampled token is the most likely one.
    eq(want.top[0].token, ref.token_ids[i], `generate's top token ${i} is the sampled one`);
    ok(Object.values(top).every((v) => v <= lp.token_logprobs[i]),
      `token_logprobs[${i}] ${lp.token_logprobs[i]} is the largest of top_logprobs[${i}]`, top);
    ok(lp.tokens[i] in top, `tokens[${i}] ${show(lp.tokens[i])} is a key of top_logprobs[${i}]`, top);
  }
  // vLLM: text_offset starts at 0 and advances by len(token), Python's length: code points.
  const offsets = [];
  let offset = 0;
  for (const token of lp.tokens) {
    offsets.push(offset);
    offset += codePoints(token);
  }
  eq(lp.text_offset, offsets, `text_offset (tokens ${show(lp.tokens)})`);
});

test('chat logprobs: true, top_logprobs: 2 equals generate --logprobs 2', async () => {
  const n = 6;
  const ids = await tokenizeChat(MESSAGES);
  const ref = generate(ids, n, ['--logprobs', '2']);
  const r = await client.chat.completions.create({
    model: SERVED, messages: MESSAGES, max_tokens: n, temperature: 0, ignore_eos: true,
    logprobs: true, top_logprobs: 2,
  });
  const content = r.choices[0].logprobs?.content;
  ok(Array.isArray(content), 'choices[0].logprobs.content is a list', r.choices[0]);
  eq(content.length, n, 'entries of logprobs.content');
  eq(r.choices[0].message.content, ref.text, 'content vs generate');
  for (let i = 0; i < n; ++i) {
    const e = content[i];
    const want = ref.logprobs[i];
    eq(e.token, await detokenize([ref.token_ids[i]]), `content[${i}].token (id ${ref.token_ids[i]})`);
    ok(e.logprob <= 0, `content[${i}].logprob <= 0`, e);
    near(e.logprob, want.logprob, `content[${i}].logprob vs generate`);
    ok(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256),
      `content[${i}].bytes are byte values`, e.bytes);
    if (!e.token.includes('\uFFFD')) {
      eq(Buffer.from(e.bytes).toString('utf8'), e.token, `content[${i}].bytes decode to the token`);
    }
    eq(e.top_logprobs.length, 2, `content[${i}].top_logprobs entries`);
    e.top_logprobs.forEach((t, k) => {
      ok(typeof t.token === 'string' && Array.isArray(t.bytes), `content[${i}].top_logprobs[${k}] shape`, t);
      ok(t.logprob <= 0, `content[${i}].top_logprobs[${k}].logprob <= 0`, t);
      near(t.logprob, want.top[k].logprob, `content[${i}].top_logprobs[${k}].logprob vs generate`);
    });
    ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, `content[${i}].top_logprobs sorted`, e.top_logprobs);
    // Greedy: the sampled token is the top entry.
    eq(e.token, e.top_logprobs[0].token, `content[${i}].token vs top_logprobs[0].token`);
    eq(e.logprob, e.top_logprobs[0].logprob, `content[${i}].logprob vs top_logprobs[0].logprob`);
  }
  // Streamed, the per-chunk logprobs add up to the same list.
  const stream = await client.chat.completions.create({
    model: SERVED, messages: MESSAGES, max_tokens: n, temperature: 0, ignore_eos: true,
    logprobs: true, top_logprobs: 2, stream: true,
  });
  const streamed = [];
  for await (const c of stream) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
  eq(streamed, content, 'streamed logprobs.content vs non-stream');
});

test('n = 3 with temperature 1 and a seed: three repeatable choices, as generate --n 3', async () => {
  const request = {
    model: SERVED, prompt: PROMPT, max_tokens: 8, temperature: 1, seed: 11, n: 3, ignore_eos: true,
  };
  const a = await client.completions.create(request);
  eq(a.choices.map((c) => c.index), [0, 1, 2], 'choice indices');
  for (const c of a.choices) eq(c.finish_reason, 'length', `finish_reason of choice ${c.index}`);
  eq(a.usage.completion_tokens, 24, 'completion_tokens of 3 x 8');
  eq(a.usage.prompt_tokens, PROMPT.length, 'prompt_tokens (counted once)');
  const b = await client.completions.create(request);
  eq(b.choices.map((c) => c.text), a.choices.map((c) => c.text), 'texts of the same seeded request again');
  const ref = generate(PROMPT, 8, ['--n', '3', '--seed', '11', '--temperature', '1'], true);
  const refTexts = [...ref].sort((x, y) => x.choice - y.choice).map((x) => x.text);
  eq(a.choices.map((c) => c.text), refTexts, 'texts vs generate --n 3 --seed 11 --temperature 1');
  // Streamed: each chunk's choice index routes its text.
  const stream = await client.completions.create({ ...request, stream: true });
  const texts = ['', '', ''];
  for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.text;
  eq(texts, a.choices.map((c) => c.text), 'streamed texts per index');
});

// Greedy text of PROMPT and a stop string in it: two ASCII letters after the first character.
async function greedyAndStop() {
  const request = { model: SERVED, prompt: PROMPT, max_tokens: 24, temperature: 0, ignore_eos: true };
  const text = (await client.completions.create(request)).choices[0].text;
  const m = /[A-Za-z]{2}/.exec(text.slice(1));
  ok(m, 'the greedy text has two ASCII letters after its start', text);
  return { request, text, stop: m[0], cut: text.indexOf(m[0]) };
}

test('stop: a stop string from the greedy text ends the output before it', async () => {
  const { request, text, stop, cut } = await greedyAndStop();
  const r = await client.completions.create({ ...request, stop });
  eq(r.choices[0].text, text.slice(0, cut), `text with stop ${show(stop)} (greedy text ${show(text)})`);
  eq(r.choices[0].finish_reason, 'stop', 'finish_reason');
  const listed = await client.completions.create({ ...request, stop: ['\u0001never', stop] });
  eq(listed.choices[0].text, text.slice(0, cut), 'text with a list of stop strings');
  // Streamed, the stop string never shows either.
  const stream = await client.completions.create({ ...request, stop, stream: true });
  let streamed = '';
  let finish = null;
  for await (const c of stream) {
    streamed += c.choices[0].text;
    finish = c.choices[0].finish_reason ?? finish;
  }
  eq(streamed, text.slice(0, cut), 'streamed text with stop');
  eq(finish, 'stop', 'streamed finish_reason');
  // Chat takes stop strings too.
  const chatRequest = { model: SERVED, messages: MESSAGES, max_tokens: 24, temperature: 0, ignore_eos: true };
  const chatText = (await client.chat.completions.create(chatRequest)).choices[0].message.content;
  const cm = /[A-Za-z]{2}/.exec(chatText.slice(1));
  if (cm) {
    const chat = await client.chat.completions.create({ ...chatRequest, stop: [cm[0]] });
    eq(chat.choices[0].message.content, chatText.slice(0, chatText.indexOf(cm[0])), `chat content with stop ${show(cm[0])}`);
    eq(chat.choices[0].finish_reason, 'stop', 'chat finish_reason');
  }
});

// A stop token id of the greedy output of PROMPT (first seen at index k >= 2) and that output.
function stopTokenOfGreedy() {
  const ref = generate(PROMPT, 8);
  const k = ref.token_ids.findIndex((id, j) => j >= 2 && ref.token_ids.indexOf(id) === j);
  return { ref, k, stopId: ref.token_ids[k] };
}

test('stop_token_ids: the output ends at the stop token, its text left out', async () => {
  const { ref, k, stopId } = stopTokenOfGreedy();
  const r = await client.completions.create({
    model: SERVED, prompt: PROMPT, max_tokens: 8, temperature: 0, ignore_eos: true, stop_token_ids: [stopId],
  });
  eq(r.choices[0].finish_reason, 'stop', `finish_reason with stop_token_ids [${stopId}]`);
  eq(r.usage.completion_tokens, k + 1, 'completion_tokens (the stop token counts)');
  // vLLM's detokenizer skips a stop token's text unless include_stop_str_in_output.
  eq(r.choices[0].text, await detokenize(ref.token_ids.slice(0, k)), 'text before the stop token');
});

test('stop_reason: the stop string or stop token id that ended the output (vLLM)', async () => {
  const { request, stop } = await greedyAndStop();
  const { stopId } = stopTokenOfGreedy();
  const got = {
    byString: (await client.completions.create({ ...request, stop })).choices[0].stop_reason,
    byTokenId: (await client.completions.create({ ...request, stop_token_ids: [stopId] })).choices[0].stop_reason,
    byLength: (await client.completions.create(request)).choices[0].stop_reason,
    chatByString: (await client.chat.completions.create({
      model: SERVED, messages: MESSAGES, max_tokens: 24, temperature: 0, ignore_eos: true, stop: [' '],
    })).choices[0].stop_reason ?? null,
  };
  const chatText = (await client.chat.completions.create({
    model: SERVED, messages: MESSAGES, max_tokens: 24, temperature: 0, ignore_eos: true,
  })).choices[0].message.content;
  eq(got, { byString: stop, byTokenId: stopId, byLength: null,
    chatByString: chatText.includes(' ') ? ' ' : null }, 'stop_reason of (stop string, stop token id, max_tokens, chat stop string)');
});

// Asserts that `promise` rejects with `Class` (status, param as given), with vLLM's body.
async function rejectsWith(promise, Class, status, param, what) {
  await assert.rejects(promise, (err) => {
    ok(err instanceof Class, `${what}: error class ${Class.name}, got ${err?.constructor?.name}: ${err?.message}`);
    ok(err instanceof APIError, `${what}: an APIError`);
    eq(err.status, status, `${what}: status`);
    if (param !== undefined) {
      eq(err.param, param, `${what}: error.param (error body ${show(err.error)})`);
      ok(typeof err.error?.message === 'string', `${what}: error.message is a string`, err.error);
      ok(typeof err.type === 'string', `${what}: error.type is a string`, err.error);
      eq(err.code, status, `${what}: error.code`);
    }
    return true;
  });
  await stillServing();
}

test('unknown model: NotFoundError (404, param "model")', async () => {
  await rejectsWith(
    client.completions.create({ model: 'no-such-model', prompt: PROMPT, max_tokens: 2 }),
    NotFoundError, 404, 'model', 'completions with an unknown model');
  await rejectsWith(
    client.chat.completions.create({ model: 'no-such-model', messages: MESSAGES, max_tokens: 2 }),
    NotFoundError, 404, 'model', 'chat with an unknown model');
});

test('wrong API key: AuthenticationError (401)', async () => {
  const wrong = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: 'wrong-key', maxRetries: 0 });
  await rejectsWith(wrong.completions.create({ model: SERVED, prompt: PROMPT, max_tokens: 2 }),
    AuthenticationError, 401, undefined, 'completions with a wrong key');
  await rejectsWith(wrong.models.list(), AuthenticationError, 401, undefined, 'models.list with a wrong key');
  await rejectsWith(
    wrong.chat.completions.create({ model: SERVED, messages: MESSAGES, max_tokens: 2, stream: true }),
    AuthenticationError, 401, undefined, 'streaming chat with a wrong key');
});

test('invalid requests: BadRequestError (400) with vLLM\'s param', async () => {
  const base = { model: SERVED, prompt: PROMPT };
  const cases = [
    [{ ...base, max_tokens: -1 }, 'max_tokens'],
    [{ ...base, max_tokens: 2, temperature: 5 }, 'temperature'],
    [{ ...base, prompt: new Array(MAX_MODEL_LEN).fill(5), max_tokens: 1 }, 'input_tokens'],
    [{ ...base, max_tokens: MAX_MODEL_LEN }, 'max_tokens'],
    [{ ...base, max_tokens: 2, n: 0 }, 'n'],
    [{ ...base, max_tokens: 2, stream_options: { include_usage: true } }, 'stream_options'],
  ];
  for (const [body, param] of cases) {
    await rejectsWith(client.completions.create(body), BadRequestError, 400, param,
      `completions ${show({ ...body, prompt: body.prompt.length > 10 ? `<${body.prompt.length} ids>` : body.prompt })}`);
  }
  // The same checks when streaming: the error comes before the stream starts.
  await rejectsWith(client.completions.create({ ...base, max_tokens: -1, stream: true }),
    BadRequestError, 400, 'max_tokens', 'streaming completions with max_tokens -1');
  const chat = { model: SERVED, messages: MESSAGES };
  await rejectsWith(client.chat.completions.create({ ...chat, max_tokens: 2, temperature: 5 }),
    BadRequestError, 400, 'temperature', 'chat with temperature 5');
  await rejectsWith(
    client.chat.completions.create({ ...chat, max_tokens: 2, logprobs: true, top_logprobs: 50 }),
    BadRequestError, 400, 'top_logprobs', 'chat with top_logprobs 50');
  await rejectsWith(
    client.chat.completions.create({ model: SERVED, messages: [{ role: 'user', content: 'a b '.repeat(MAX_MODEL_LEN) }] }),
    BadRequestError, 400, 'input_tokens', 'chat with a prompt longer than max_model_len');
});
