#!/usr/bin/env python3
"""trace_summary.py - reads tests/cuda/cupti_trace.c's kernel records and prints, for one
launch of a captured decode graph, where the step's time goes when its kernels overlap
(programmatic dependent launch):

  scripts/trace_summary.py TRACE [--graph ID] [--launch N]

For each kernel (in launch order) the 'advance' is how far it moved the step's finish
line: its end minus the latest end before it. Advances sum to the step's length, so
they split it among kernels as they really ran; 'busy' is end - start. Lines are
grouped by kernel name (summed over layers). Without --graph: the graph with the most
kernel records; --launch picks one launch of it (default: the middle one)."""
import re
import sys
from collections import defaultdict


def short(name):
    """The function name of an Itanium-mangled kernel name (_Z<len><name>...)."""
    m = re.match(r'_Z(\d+)', name)
    if not m:
        return name[:40]
    k = int(m.group(1))
    return name[m.end():m.end() + k][:40]


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    path, gid, launch = args[0], None, None
    if '--graph' in args:
        gid = int(args[args.index('--graph') + 1])
    if '--launch' in args:
        launch = int(args[args.index('--launch') + 1])
    recs = []
    with open(path) as f:
        for line in f:
            p = line.split(None, 5)
            if len(p) < 6:
                continue
            recs.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4]), p[5].strip()))
    by_graph = defaultdict(list)
    for r in recs:
        if r[2]:
            by_graph[r[2]].append(r)
    if gid is None:
        gid = max(by_graph, key=lambda g: len(by_graph[g]))
    ks = sorted(by_graph[gid])
    # split into launches: a launch's kernels have increasing correlation ids only across
    # launches; use gaps of > 20 us between one kernel's end and the next start
    launches, cur, last_end = [], [], None
    for r in ks:
        if cur and r[0] - last_end > 20000:
            launches.append(cur)
            cur = []
        cur.append(r)
        last_end = max(last_end or 0, r[1]) if cur[:-1] else r[1]
    if cur:
        launches.append(cur)
    li = launch if launch is not None else len(launches) // 2
    run = launches[li]
    t0 = run[0][0]
    total = max(r[1] for r in run) - t0
    adv, busy, cnt = defaultdict(int), defaultdict(int), defaultdict(int)
    front = t0
    for r in run:
        n = short(r[5])
        a = max(0, r[1] - front)
        front = max(front, r[1])
        adv[n] += a
        busy[n] += r[1] - r[0]
        cnt[n] += 1
    print(f"graph {gid}: {len(launches)} launches of {len(run)} kernels; launch {li}: {total / 1000:.1f} us")
    print(f"{'kernel':42s} {'count':>5s} {'advance us':>11s} {'share':>6s} {'busy us':>9s}")
    for n in sorted(adv, key=lambda n: -adv[n]):
        print(f"{n:42s} {cnt[n]:5d} {adv[n] / 1000:11.1f} {100 * adv[n] / total:5.1f}% {busy[n] / 1000:9.1f}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
