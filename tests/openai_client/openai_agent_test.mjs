// An agent's loop through the official OpenAI Node client against `moeserve serve` on the default
// model with Qwen3.5's chat template (tool calls read as qwen3_xml, reasoning as qwen3, both by
// `auto`): a required tool call, its result, the answer; the same call streamed through the
// client's stream helper; reasoning read from the message; response_format json_schema.
// run.sh passes OPENAI_TEST_URL, OPENAI_TEST_API_KEY and OPENAI_TEST_MODEL.
import assert from 'node:assert/strict';
import test from 'node:test';
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: `${process.env.OPENAI_TEST_URL}/v1`, apiKey: process.env.OPENAI_TEST_API_KEY,
  maxRetries: 0, timeout: 120_000,
});
const MODEL = process.env.OPENAI_TEST_MODEL;
const NO_THINKING = { chat_template_kwargs: { enable_thinking: false } };

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather for some days',
    parameters: {
      type: 'object',
      properties: { unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
                    days: { type: 'integer', minimum: 1, maximum: 7 } },
      required: ['unit', 'days'],
    },
  },
}];

function checkArguments(text) {
  const args = JSON.parse(text);
  assert.ok(['celsius', 'fahrenheit'].includes(args.unit), text);
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, text);
  assert.deepEqual(Object.keys(args).sort(), ['days', 'unit'], text);
}

test('a tool loop: a required call, the tool result, then the answer', async () => {
  const messages = [{ role: 'user', content: 'What will the weather be this week?' }];
  const first = await client.chat.completions.create({
    model: MODEL, messages, tools, tool_choice: 'required', parallel_tool_calls: false,
    temperature: 1, seed: 4, max_tokens: 100, ...NO_THINKING,
  });
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
  checkArguments(call.function.arguments);
  // As agents do: the assistant message as returned, then the tool's result.
  messages.push(choice.message, { role: 'tool', tool_call_id: call.id, content: 'Sunny, 21 degrees.' });
  const second = await client.chat.completions.create({
    model: MODEL, messages, tools, temperature: 0, max_tokens: 16, ...NO_THINKING,
  });
  assert.equal(typeof second.choices[0].message.content, 'string');
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens, 'the history grew');
});

test('a named call streamed through the stream helper', async () => {
  const stream = client.chat.completions.stream({
    model: MODEL, messages: [{ role: 'user', content: 'Weather?' }], tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    parallel_tool_calls: false, temperature: 1, seed: 9, max_tokens: 100, ...NO_THINKING,
  });
  const done = await stream.finalChatCompletion();
  const choice = done.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.tool_calls.length, 1);
  checkArguments(choice.message.tool_calls[0].function.arguments);
});

test('thinking is read as reasoning', async () => {
  const answer = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Tell me a story.' }],
    temperature: 0, max_tokens: 12,
  });
  const message = answer.choices[0].message;
  assert.equal(typeof message.reasoning, 'string', JSON.stringify(message));
  assert.ok(message.reasoning.length > 0);
  assert.equal(message.reasoning_content, message.reasoning);
});

test('response_format json_schema gives JSON valid under the schema', async () => {
  const answer = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'A city and its size?' }],
    temperature: 1, seed: 2, max_tokens: 80, ...NO_THINKING,
    response_format: {
      type: 'json_schema',
      json_schema: {
        name: 'city', strict: true,
        schema: { type: 'object', properties: { big: { type: 'boolean' },
                                                rank: { type: 'integer', minimum: 1, maximum: 9 } },
                  required: ['big', 'rank'], additionalProperties: false },
      },
    },
  });
  const value = JSON.parse(answer.choices[0].message.content);
  assert.equal(typeof value.big, 'boolean');
  assert.ok(Number.isInteger(value.rank) && value.rank >= 1 && value.rank <= 9);
});
