// load.mjs - a bounded loopback load test of `dsv3 serve`: CLIENTS concurrent
// clients send REQUESTS requests in all, 10% of them disconnecting mid-stream
// and 5% malformed. Every request must be answered (or closed by us), the
// malformed ones with a 4xx; the server must stay up, end with no sequence
// running and nothing queued, and its RSS after the run must match its RSS
// after warm-up within a few percent. Prints "N passed, N failed".
//   node load.mjs URL SERVER_PID [REQUESTS=300] [CLIENTS=16]
import { readFileSync } from 'node:fs';

const [url, pid, total = '300', clients = '16'] = process.argv.slice(2);
const N = +total, C = +clients;
let passed = 0, failed = 0;
function check(what, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error('FAIL:', what, detail === undefined ? '' : JSON.stringify(detail)); }
}
const rssKb = () => +readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1];
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const words = ['city', 'sea', 'old man', 'road', 'river', 'war', 'music', 'school'];
const malformed = ['{"messages": [', '{"messages": "hi"}', '{"messages":[{"role":"alien","content":"x"}]}',
                   '{"messages":[{"role":"user","content":"x"}],"max_tokens":"lots"}', 'null', '\u0000\u0001',
                   '{"messages":[{"role":"user","content":"x"}],"n":1000}', '{"prompt":{}}'];
const stats = { ok: 0, bad: 0, aborted: 0, busy: 0, errors: [] };

async function one(i) {
  const r = rand();
  const kind = r < 0.05 ? 'malformed' : r < 0.15 ? 'disconnect' : 'normal';
  const stream = kind === 'disconnect' || rand() < 0.5;
  const chat = rand() < 0.8;
  const body = kind === 'malformed' ? malformed[i % malformed.length] : JSON.stringify(chat
    ? { messages: [{ role: 'user', content: `Tell me about the ${words[i % words.length]}.` }],
        max_tokens: kind === 'disconnect' ? 200 : 4 + (i % 12), temperature: rand() < 0.5 ? 0 : 0.8, stream,
        seed: i, stream_options: stream ? { include_usage: true } : undefined }
    : { prompt: `The ${words[i % words.length]}`, max_tokens: 4 + (i % 8), stream });
  const path = kind === 'malformed' || chat ? '/v1/chat/completions' : '/v1/completions';
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 60000);
  try {
    const res = await fetch(url + path, { method: 'POST', body, signal: ac.signal,
                                          headers: { 'Content-Type': 'application/json' } });
    if (kind === 'malformed') {
      const j = await res.json();
      if (res.status >= 400 && res.status < 500 && j.error?.message) stats.bad++;
      else stats.errors.push({ i, status: res.status, body });
      return;
    }
    if (res.status === 503) { stats.busy++; await res.text(); return; }
    if (res.status !== 200) { stats.errors.push({ i, status: res.status, text: await res.text() }); return; }
    if (kind === 'disconnect') { // read the first chunk, then leave
      const rd = res.body.getReader();
      await rd.read();
      ac.abort();
      stats.aborted++;
      return;
    }
    const text = await res.text();
    if (stream ? text.trimEnd().endsWith('data: [DONE]') : JSON.parse(text).choices?.length === 1) stats.ok++;
    else stats.errors.push({ i, text: text.slice(-200) });
  } catch (e) {
    if (kind === 'disconnect' && e.name === 'AbortError') stats.aborted++;
    else stats.errors.push({ i, error: String(e) });
  } finally {
    clearTimeout(timer);
  }
}

async function run(from, to) {
  let next = from;
  await Promise.all(Array.from({ length: C }, async () => { while (next < to) await one(next++); }));
}

const warm = Math.max(C, Math.floor(N / 5));
await run(0, warm);
await new Promise(r => setTimeout(r, 300));
const rss0 = rssKb();
await run(warm, N);
await new Promise(r => setTimeout(r, 500));
const rss1 = rssKb();
const metrics = await (await fetch(url + '/metrics')).text();
const gauge = name => +metrics.match(new RegExp(`^${name} (\\d+)`, 'm'))[1];
check('every request answered or closed', stats.ok + stats.bad + stats.aborted + stats.busy === N && !stats.errors.length,
      { ...stats, errors: stats.errors.slice(0, 5) });
check('malformed requests got 4xx', stats.bad > 0, stats);
check('clients left mid-stream', stats.aborted > 0, stats);
check('the server is healthy', (await fetch(url + '/health')).status === 200);
check('no sequence running, nothing queued', gauge('dsv3_running_sequences') === 0 && gauge('dsv3_queue_depth') === 0,
      metrics.match(/^dsv3_(running|queue).*$/mg));
check('RSS after the run within 5% (+4 MiB) of RSS after warm-up', rss1 <= rss0 * 1.05 + 4096, { rss0, rss1 });
console.log(`load: ${N} requests, ${C} clients: ${stats.ok} answered, ${stats.bad} malformed refused, ` +
            `${stats.aborted} disconnected, ${stats.busy} busy; RSS ${rss0} -> ${rss1} KiB`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
