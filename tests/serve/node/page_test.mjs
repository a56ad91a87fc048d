// page_test.mjs - the chat page at GET / in headless Chromium (Debian's, driven
// by playwright-core): type a message, see the streamed answer (greedy: equal to
// the API's reply for the same messages), then start a long answer and press
// Stop: the stream ends at once and the server counts a cancelled request.
// Prints "N passed, N failed".   node page_test.mjs URL SCREENSHOT_DIR
import { chromium } from 'playwright-core';

const [url, shots] = process.argv.slice(2);
let passed = 0, failed = 0;
function check(what, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error('FAIL:', what, detail === undefined ? '' : JSON.stringify(detail)); }
}
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
                                        args: ['--no-sandbox', '--disable-gpu'] });
try {
  const page = await browser.newPage();
  let longRun = false;
  // the long answer must outlast the click: ask the server to ignore eos for it
  await page.route('**/v1/chat/completions', route => {
    const body = JSON.parse(route.request().postData());
    if (longRun) Object.assign(body, { ignore_eos: true, max_tokens: 2000 }); // seconds of decoding
    route.continue({ postData: JSON.stringify(body) });
  });
  await page.goto(url + '/');
  check('the page loads', (await page.title()) === 'dsv3 chat');
  await page.fill('#temp', '0');
  await page.fill('#maxt', '20');
  await page.fill('#msg', 'Tell me about the city.');
  await page.press('#msg', 'Enter');
  await page.waitForFunction(() => !document.getElementById('send').disabled &&
                             document.querySelectorAll('.assistant').length === 1, null, { timeout: 30000 });
  const shown = await page.textContent('.assistant span');
  const api = await (await fetch(url + '/v1/chat/completions', { method: 'POST', body: JSON.stringify({
    messages: [{ role: 'user', content: 'Tell me about the city.' }], max_tokens: 20, temperature: 0,
    thinking: { type: 'disabled' } }) })).json();
  check('the streamed answer equals the API reply', shown === api.choices[0].message.content,
        [shown, api.choices[0].message.content]);
  await page.screenshot({ path: shots + '/chat.png' });

  longRun = true;
  await page.fill('#maxt', '2000');
  await page.fill('#msg', 'And the sea?');
  await page.press('#msg', 'Enter');
  await page.waitForFunction(() => (document.querySelectorAll('.assistant span')[1]?.textContent || '').length > 10,
                             null, { timeout: 30000 });
  check('stop is enabled while streaming', !(await page.isDisabled('#stop')));
  await page.click('#stop', { timeout: 5000 });
  await page.waitForFunction(() => !document.getElementById('send').disabled, null, { timeout: 10000 });
  const last = await page.textContent('.assistant:last-child');
  check('the answer is marked stopped', last.endsWith('[stopped]'), last.slice(-60));
  await page.screenshot({ path: shots + '/stopped.png' });
  let cancelled = 0;
  for (let i = 0; i < 30 && !cancelled; i++) {
    const m = await (await fetch(url + '/metrics')).text();
    cancelled = +m.match(/^dsv3_requests_cancelled_total (\d+)/m)[1];
    const running = +m.match(/^dsv3_running_sequences (\d+)/m)[1];
    if (cancelled && running) cancelled = 0;
    await new Promise(r => setTimeout(r, 100));
  }
  check('the server cancelled the stopped stream and freed its slot', cancelled === 1);
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
