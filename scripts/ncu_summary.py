#!/usr/bin/env python3
"""ncu_summary.py PROF_CSV [MODE] - summarises an Nsight Compute raw CSV (ncu --csv --page raw
--print-units base) of bench_cuda_model's BENCH_PROFILE steps: the kernels are split into
steps at each embed_kernel (MODE: BENCH_PROFILE's value, 1, decode or prefill: names the
steps), and per step kernels are grouped by (name, grid): count, total
time, share, mean time, achieved DRAM bandwidth (read + write bytes / time)."""
import csv
import sys

SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "byte": 1.0, "Kbyte": 1e3,
         "Mbyte": 1e6, "Gbyte": 1e9}


def main(path, mode="1"):
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        print("ncu_summary: no kernels in", path)
        return 1
    head, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}

    def val(r, name):
        i = col[name]
        try:
            return float(r[i].replace(",", "")) * SCALE.get(units[i], 1.0)
        except ValueError:
            return 0.0

    steps, cur = [], None
    for r in data:
        name = r[col["Kernel Name"]]
        if "embed_kernel" in name or cur is None:
            cur = []
            steps.append(cur)
        t = val(r, "gpu__time_duration.sum")
        b = val(r, "dram__bytes_read.sum") + val(r, "dram__bytes_write.sum")
        cur.append((name.split("(")[0][:48], r[col["launch__grid_size"]], r[col["launch__block_size"]], t, b))
    labels = ["batch 1 depth 0", "batch 1 depth 4096", "batch 8 depth 0", "prefill 512"]
    if mode == "prefill":
        labels = ["prefill 512"]
    for si, st in enumerate(steps):
        tot = sum(k[3] for k in st)
        byt = sum(k[4] for k in st)
        print(f"== step {si} ({labels[si] if si < len(labels) else '?'}): {len(st)} kernels, "
              f"{tot * 1e3:.3f} ms kernel time, {byt / 1e9:.3f} GB DRAM, {byt / tot / 1e9:.0f} GB/s")
        g = {}
        for n, grid, blk, t, b in st:
            e = g.setdefault((n, grid, blk), [0, 0.0, 0.0])
            e[0] += 1
            e[1] += t
            e[2] += b
        print(f"{'kernel':48s} {'grid':>7s} {'blk':>4s} {'n':>4s} {'tot us':>8s} {'share':>6s} {'mean us':>8s} {'GB/s':>6s}")
        for (n, grid, blk), (c, t, b) in sorted(g.items(), key=lambda kv: -kv[1][1])[:22]:
            print(f"{n:48s} {grid:>7s} {blk:>4s} {c:4d} {t * 1e6:8.1f} {100 * t / tot:5.1f}% {t / c * 1e6:8.2f} "
                  f"{b / t / 1e9:6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
