// reasoning_test.mjs - the openai client against `dsv3 serve` running the
// chain model of chain_model.mjs (started by tests/serve/serve_reasoning.sh):
// its greedy reply is known text, "Let me look</think>\n\n" followed by one
// call of get_weather in V3.1's tool-call format, so the reasoning split and
// the tool-call parsing can be checked exactly, whole and streamed.
// Prints "N passed, N failed".
import OpenAI from 'openai';

const base = process.env.SERVE_URL;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 60000 });
let passed = 0, failed = 0;
function check(what, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error('FAIL:', what, detail === undefined ? '' : JSON.stringify(detail)); }
}
const REASONING = 'Let me look', ARGS = '{"city": "Paris"}';
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const isCall = c => c?.type === 'function' && c.function.name === 'get_weather' && c.function.arguments === ARGS &&
  typeof c.id === 'string' && c.id.length > 0;

// DeepSeek's switch: the template opens <think>, the reply reasons, then calls the tool
const on = await client.chat.completions.create({ messages, temperature: 0, max_tokens: 40,
                                                  thinking: { type: 'enabled' } });
const m = on.choices[0].message;
check('thinking: reasoning_content split from content', m.reasoning_content === REASONING && !m.content, m);
check('thinking: the tool call parsed', m.tool_calls?.length === 1 && isCall(m.tool_calls[0]), m.tool_calls);
check('finish_reason tool_calls', on.choices[0].finish_reason === 'tool_calls', on.choices[0].finish_reason);

// chat_template_kwargs' switch, streamed: deltas carry reasoning, then the call
const stream = await client.chat.completions.create({ messages, temperature: 0, max_tokens: 40, stream: true,
                                                      chat_template_kwargs: { thinking: true } });
let reasoning = '', content = '', finish = null, calls = [], order = [];
for await (const chunk of stream)
  for (const c of chunk.choices) {
    const d = c.delta;
    if (d.reasoning_content) { reasoning += d.reasoning_content; order.push('r'); }
    if (d.content) { content += d.content; order.push('c'); }
    for (const t of d.tool_calls ?? []) {
      order.push('t');
      const have = calls[t.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
      if (t.id) have.id = t.id;
      if (t.function?.name) have.function.name += t.function.name;
      if (t.function?.arguments) have.function.arguments += t.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
check('streamed reasoning deltas', reasoning === REASONING && content === '', { reasoning, content });
check('streamed tool call', calls.length === 1 && isCall(calls[0]), calls);
check('reasoning streams before the call', order.length > 1 && order[0] === 'r' && order.at(-1) === 't', order);
check('streamed finish_reason tool_calls', finish === 'tool_calls', finish);

// thinking off: the template closes the block, nothing is reasoning
const off = await client.chat.completions.create({ messages, temperature: 0, max_tokens: 40,
                                                   chat_template_kwargs: { thinking: false } });
const o = off.choices[0].message;
check('no thinking: the text stays content', o.reasoning_content === undefined &&
      o.content === REASONING + '</think>\n\n', o);
check('no thinking: the tool call parsed', o.tool_calls?.length === 1 && isCall(o.tool_calls[0]), o.tool_calls);

// the call and its result go back: rendered through the template (V3.1 adds
// no generation prompt after a tool's output), and the earlier turn's
// reasoning is not part of the prompt
const round = [...messages,
  { role: 'assistant', content: null, reasoning_content: REASONING, tool_calls: [m.tool_calls[0]] },
  { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"temperature": 21}' }];
const next = await client.chat.completions.create({ messages: round, temperature: 0, max_tokens: 40,
                                                    thinking: { type: 'enabled' } });
const post = async (p, body) => (await fetch(base + p, { method: 'POST', body: JSON.stringify(body) })).json();
const ids = (await post('/tokenize', { messages: round, thinking: { type: 'enabled' } })).tokens;
const text = (await post('/detokenize', { tokens: ids })).content;
check('the tool result is rendered into the prompt', next.usage.prompt_tokens === ids.length &&
      text.includes('{"temperature": 21}') && text.includes('get_weather'), { usage: next.usage, text });
check('the earlier turn\'s reasoning is dropped from the prompt', !text.includes(REASONING), text);
check('the next turn is answered', typeof next.choices[0].finish_reason === 'string', next.choices[0]);

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
