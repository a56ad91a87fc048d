// argmax.js FILE: prints the argmax of each row of the F32 tensor "logits" in a
// safetensors file (an independent reader, to check dsv3's logits output).
const fs = require('fs');
const b = fs.readFileSync(process.argv[2]);
const n = Number(b.readBigUInt64LE(0));
const h = JSON.parse(b.subarray(8, 8 + n).toString());
const t = h.logits;
const [rows, cols] = t.shape;
const data = b.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
const f = new Float32Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.length));
const out = [];
for (let r = 0; r < rows; r++) {
  let best = 0;
  for (let c = 1; c < cols; c++) if (f[r * cols + c] > f[r * cols + best]) best = c;
  out.push(best);
}
console.log(out.join(' '));
