// ref_nll.js SAFETENSORS NAME [mtp]: the mean next-token loss (-log softmax, in
// double precision) of the reference logits NAME/logits at rows NAME/rows
// against the targets NAME/tokens[row + 1], read independently of dsv3; with
// mtp, of the MTP module's NAME/mtp_logits at NAME/mtp_rows against
// NAME/tokens[row + 2].
const fs = require('fs');
const b = fs.readFileSync(process.argv[2]);
const name = process.argv[3], mtp = process.argv[4] === 'mtp', ahead = mtp ? 2 : 1;
const n = Number(b.readBigUInt64LE(0));
const h = JSON.parse(b.subarray(8, 8 + n).toString());
function tensor(key, Ctor) {
  const t = h[key];
  const d = b.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
  return { shape: t.shape, data: new Ctor(d.buffer.slice(d.byteOffset, d.byteOffset + d.length)) };
}
const logits = tensor(`${name}/${mtp ? 'mtp_' : ''}logits`, Float32Array);
const rows = tensor(`${name}/${mtp ? 'mtp_' : ''}rows`, Int32Array).data;
const tokens = tensor(`${name}/tokens`, Int32Array).data;
const V = logits.shape[1];
let sum = 0, count = 0;
for (let r = 0; r < rows.length; r++) {
  const p = rows[r];
  if (p + ahead >= tokens.length) continue;
  const row = logits.data.subarray(r * V, (r + 1) * V);
  let mx = -Infinity;
  for (const x of row) mx = Math.max(mx, x);
  let s = 0;
  for (const x of row) s += Math.exp(x - mx);
  sum += mx + Math.log(s) - row[tokens[p + ahead]];
  count++;
}
console.log(`${(sum / count).toFixed(8)} ${count}`);
