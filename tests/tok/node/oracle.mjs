// oracle.mjs - reference outputs for the tok tests.
//   node oracle.mjs tok TOKDIR CORPUS OUT.json   ids from @huggingface/tokenizers for the corpus
//        (lines, paragraphs, the whole file) and for seeded random strings and byte strings
//   node oracle.mjs chat CASES.json OUT.json     templates rendered by @huggingface/jinja
import fs from "node:fs";

function rng(seed) {
  let s = seed >>> 0;
  return () => { s = (s * 1664525 + 1013904223) >>> 0; return s / 4294967296; };
}

function randomCodePoint(r) {
  const pools = [[0x20, 0x7e], [0x0, 0x20], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x6ff],
    [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f], [0x2070, 0x2bff], [0x3000, 0x30ff],
    [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xfe00, 0xffef], [0x1f300, 0x1f64f], [0x40000, 0x10ffff]];
  // (no characters assigned after Unicode 13: PCRE2 10.42, Oniguruma and Node's ICU
  // know different Unicode versions, and \p{S} etc. differ for new characters)
  const [lo, hi] = pools[Math.floor(r() * pools.length)];
  let cp = lo + Math.floor(r() * (hi - lo + 1));
  if (cp >= 0xd800 && cp <= 0xdfff) cp = 0x41;
  return cp;
}

const specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", " ", "  ", "\n", "\r\n",
  "\t", "123", "'s", "'ll", "Ġ", "a", "中文", "の", "😀", "!", "...", "\u00a0", "\u3000", "\u0085", "\ufeff", "\u200b"];

function tok(dir, corpusPath, outPath) {
  return import("@huggingface/tokenizers").then(({ Tokenizer }) => {
    const tj = JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8"));
    const tc = JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
    const t = new Tokenizer(tj, tc);
    const enc = (s) => t.encode(s, { add_special_tokens: false }).ids;
    const corpus = fs.readFileSync(corpusPath, "utf8");
    const texts = [corpus, ...corpus.split("\n"), ...corpus.split("\n\n")];
    const r = rng(12345);
    for (let i = 0; i < 400; i++) { // random Unicode, with runs and specials mixed in
      let s = "";
      const n = Math.floor(r() * 60);
      for (let k = 0; k < n; k++) {
        const p = r();
        if (p < 0.15) s += specials[Math.floor(r() * specials.length)];
        else if (p < 0.25) s += " ".repeat(1 + Math.floor(r() * 5));
        else s += String.fromCodePoint(randomCodePoint(r));
      }
      texts.push(s);
    }
    const out = { texts: texts.map((s) => ({ text: s, ids: enc(s) })), bytes: [] };
    const dec = new TextDecoder("utf-8"); // invalid bytes -> U+FFFD, maximal subparts
    for (let i = 0; i < 300; i++) { // random bytes, biased towards UTF-8 lead/continuation bytes
      const n = Math.floor(r() * 40);
      const b = new Uint8Array(n);
      for (let k = 0; k < n; k++) {
        const p = r();
        b[k] = p < 0.3 ? 0x80 + Math.floor(r() * 64) : p < 0.5 ? 0xc0 + Math.floor(r() * 64) : Math.floor(r() * 256);
      }
      out.bytes.push({ hex: Buffer.from(b).toString("hex"), ids: enc(dec.decode(b)) });
    }
    fs.writeFileSync(outPath, JSON.stringify(out));
  });
}

function chat(casesPath, outPath) {
  return import("@huggingface/jinja").then(({ Template }) => {
    const cases = JSON.parse(fs.readFileSync(casesPath, "utf8"));
    const out = cases.map((c) => {
      try {
        const tpl = new Template(c.template);
        return { text: tpl.render({ ...(c.vars || {}), messages: c.messages, bos_token: c.bos_token,
          eos_token: c.eos_token, add_generation_prompt: c.add_generation_prompt }) };
      } catch (e) {
        return { error: String(e.message || e) };
      }
    });
    fs.writeFileSync(outPath, JSON.stringify(out));
  });
}

const [mode, ...rest] = process.argv.slice(2);
const job = mode === "tok" ? tok(...rest) : mode === "chat" ? chat(...rest) : Promise.reject(new Error("usage: oracle.mjs tok|chat ..."));
job.catch((e) => { console.error(e); process.exit(1); });
