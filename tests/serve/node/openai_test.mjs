// openai_test.mjs - the official openai client against a running `dsv3 serve`
// (started by tests/serve/serve_openai.sh, which passes its URL and the greedy
// reply `dsv3 generate` gives for the prompt). Prints "N passed, N failed".
import OpenAI from 'openai';

const base = process.env.SERVE_URL, want = process.env.GREEDY, prompt = process.env.PROMPT;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 60000 });
let passed = 0, failed = 0;
function check(what, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error('FAIL:', what, detail === undefined ? '' : JSON.stringify(detail)); }
}
const messages = [{ role: 'user', content: prompt }];

// chat, whole and streamed
const r = await client.chat.completions.create({ model: 'dsv3-mini', messages, max_tokens: 24, temperature: 0 });
check('greedy chat equals dsv3 generate', r.choices[0].message.content === want, [r.choices[0].message.content, want]);
check('object and usage', r.object === 'chat.completion' && r.usage.completion_tokens === 24 &&
      r.usage.prompt_tokens > 0, r.usage);
const stream = await client.chat.completions.create({ messages, model: 'x', max_tokens: 24, temperature: 0,
                                                      stream: true, stream_options: { include_usage: true } });
let text = '', roles = 0, finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role) roles++;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check('streamed text equals the greedy reply', text === want, [text, want]);
check('one role delta, finish length, usage chunk', roles === 1 && finish === 'length' && usage?.completion_tokens === 24,
      { roles, finish, usage });
check('a repeated prompt reports cached tokens', usage.prompt_tokens_details.cached_tokens > 0 &&
      usage.prompt_cache_hit_tokens === usage.prompt_tokens_details.cached_tokens, usage);

// n > 1 with a seed: reproducible
const ask = () => client.chat.completions.create({ messages, max_tokens: 10, temperature: 0.9, n: 2, seed: 7 });
const [a, b] = [await ask(), await ask()];
check('n=2 gives two choices', a.choices.length === 2 && a.choices[1].index === 1);
check('the same seed, the same replies', JSON.stringify(a.choices.map(c => c.message.content)) ===
      JSON.stringify(b.choices.map(c => c.message.content)));

// logprobs
const lp = await client.chat.completions.create({ messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
const entries = lp.choices[0].logprobs.content;
check('logprobs per token with alternatives', entries.length === 5 && entries.every(e => e.logprob <= 0 &&
      e.top_logprobs.length === 2 && e.top_logprobs[0].token === e.token), entries);

// stop strings
const cut = want.slice(10, 16);
const s = await client.chat.completions.create({ messages, max_tokens: 24, temperature: 0, stop: [cut] });
check('stop string cuts and is not sent', s.choices[0].message.content === want.slice(0, want.indexOf(cut)) &&
      s.choices[0].finish_reason === 'stop', s.choices[0]);

// a tool round trip: the assistant's call and the tool's result go back through the template
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather of a city',
                 parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
const round = [
  { role: 'user', content: 'What is the weather in Paris?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_0', type: 'function',
    function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
  { role: 'tool', tool_call_id: 'call_0', content: '{"temperature": 21}' },
];
const t = await client.chat.completions.create({ messages: round, tools, max_tokens: 6, temperature: 0 });
const tok = await (await fetch(base + '/tokenize', { method: 'POST', body: JSON.stringify({ messages: round, tools }) })).json();
check('tool results are rendered into the prompt', t.usage.prompt_tokens === tok.tokens.length &&
      typeof t.choices[0].message.content === 'string', { usage: t.usage, n: tok.tokens.length });

// completions
const c = await client.completions.create({ model: 'dsv3-mini', prompt: 'The old man walked', max_tokens: 6, temperature: 0 });
check('completion', c.object === 'text_completion' && c.choices[0].text.length > 0 && c.usage.completion_tokens === 6, c);
let ctext = '';
for await (const chunk of await client.completions.create({ prompt: 'The old man walked', max_tokens: 6, temperature: 0,
                                                             stream: true, model: 'm' }))
  ctext += chunk.choices[0]?.text ?? '';
check('streamed completion equals the whole one', ctext === c.choices[0].text, [ctext, c.choices[0].text]);

// models and errors
const models = await client.models.list();
check('models', models.data.length === 1 && models.data[0].id === 'dsv3-mini', models.data);
try {
  await client.chat.completions.create({ messages: [{ role: 'robot', content: 'x' }] });
  check('an unknown role is refused', false);
} catch (e) {
  check('an unknown role is a 400 naming the field', e.status === 400 && e.param === 'messages[0].role' &&
        e.type === 'invalid_request_error', { status: e.status, param: e.param, type: e.type });
}
try {
  await client.chat.completions.create({ messages, temperature: 5 });
  check('temperature 5 is refused', false);
} catch (e) {
  check('temperature 5 is a 400', e.status === 400 && e.param === 'temperature', { status: e.status, param: e.param });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
