// chain_model.mjs - turns a BF16 checkpoint written by `dsv3 synth` into a
// model whose greedy output is a fixed chain of tokens, so that the server's
// reasoning and tool-call parsing can be tested end to end with known text.
//
//   node chain_model.mjs CKPT_DIR TEMPLATE_FILE TOKEN_ID...
//
// Every attention output projection and every FFN down projection (dense,
// routed and shared experts) is zeroed, so each layer adds nothing to the
// residual stream and the final hidden state of a position is its token's
// embedding. Token TOKEN_ID[k] gets the embedding e_k (the k-th unit vector),
// the final norm's weight is 1, and the output head has one non-zero row:
// row TOKEN_ID[k+1] = e_k. The logits of a position whose token is
// TOKEN_ID[k] are then sqrt(dim) for TOKEN_ID[k+1] and 0 for every other
// token, so greedy decoding after TOKEN_ID[k] emits TOKEN_ID[k+1], ... up to
// the last id (the end-of-sentence token stops it). The ids must be distinct
// and fewer than dim. TEMPLATE_FILE replaces tokenizer_config.json's
// chat_template.
import fs from 'node:fs';
import path from 'node:path';

const [dir, templateFile, ...ids] = process.argv.slice(2);
if (!dir || !templateFile || ids.length < 2) {
  console.error('usage: node chain_model.mjs CKPT_DIR TEMPLATE_FILE TOKEN_ID...');
  process.exit(2);
}
const chain = ids.map(Number);
if (new Set(chain).size !== chain.length) throw new Error('chain token ids must be distinct');

const BF16_ONE = 0x3f80;
const index = JSON.parse(fs.readFileSync(path.join(dir, 'model.safetensors.index.json'), 'utf8'));
const files = [...new Set(Object.values(index.weight_map))];
let dim = 0, touched = 0;

for (const file of files) {
  const fd = fs.openSync(path.join(dir, file), 'r+');
  const len = Buffer.alloc(8);
  fs.readSync(fd, len, 0, 8, 0);
  const hlen = Number(len.readBigUInt64LE(0));
  const hbuf = Buffer.alloc(hlen);
  fs.readSync(fd, hbuf, 0, hlen, 8);
  const header = JSON.parse(hbuf.toString('utf8'));
  const base = 8 + hlen;
  // writes a BF16 tensor given as a function of (row, col) -> 0 or 1
  const write = (name, t, one) => {
    if (t.dtype !== 'BF16') throw new Error(`${name}: ${t.dtype}, expected BF16 (synthesise with --dtype bf16)`);
    const [rows, cols] = t.shape.length === 1 ? [1, t.shape[0]] : t.shape;
    const buf = Buffer.alloc(rows * cols * 2);
    if (one) for (const [r, c] of one(rows, cols)) buf.writeUInt16LE(BF16_ONE, (r * cols + c) * 2);
    if (buf.length !== t.data_offsets[1] - t.data_offsets[0]) throw new Error(`${name}: size`);
    fs.writeSync(fd, buf, 0, buf.length, base + t.data_offsets[0]);
    touched++;
  };
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    if (/\.(o_proj|down_proj)\.weight$/.test(name)) write(name, t, null);
    else if (name === 'model.norm.weight') write(name, t, (_, cols) => [...Array(cols).keys()].map(c => [0, c]));
    else if (name === 'model.embed_tokens.weight') {
      dim = t.shape[1];
      if (chain.length > dim) throw new Error(`at most ${dim} chain tokens`);
      // rows other than the chain's keep their random values
      for (let k = 0; k < chain.length; k++) {
        const row = Buffer.alloc(dim * 2);
        row.writeUInt16LE(BF16_ONE, k * 2);
        fs.writeSync(fd, row, 0, row.length, base + t.data_offsets[0] + chain[k] * dim * 2);
      }
      touched++;
    } else if (name === 'lm_head.weight')
      write(name, t, () => chain.slice(1).map((id, k) => [id, k]));
  }
  fs.closeSync(fd);
}
if (!dim) throw new Error('no model.embed_tokens.weight');

const cfgPath = path.join(dir, 'tokenizer_config.json');
const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
cfg.chat_template = fs.readFileSync(templateFile, 'utf8');
fs.writeFileSync(cfgPath, JSON.stringify(cfg, null, 1));
console.log(`chain_model: ${touched} tensors written, ${chain.length} chain tokens, dim ${dim}`);
