#!/usr/bin/env python3
"""trace_summary.py - reads tests/cuda/cupti_trace.c's kernel records and prints, for one
launch of a captured decode graph (or one forward pass run outside graphs, such as a
prefill), where its time goes when its kernels overlap (programmatic dependent launch):

  scripts/trace_summary.py TRACE [--graph ID] [--launch N] [--gaps K]
  scripts/trace_summary.py TRACE --pass N [--gaps K]

For each kernel (in launch order) the 'advance' is how far it moved the finish line: its
end minus the latest end before it. Advances sum to the span's length, so they split it
among kernels as they really ran; 'busy' is end - start. Lines are grouped by kernel name
(summed over layers). Without --graph: the graph with the most kernel records; --launch
picks one launch of it (default: the middle one). --pass N: the kernels outside graphs
after the last graph launch, split into forward passes at each embedding kernel; N counts
from 0, negative from the end (-1: the last). --gaps K: then the time no kernel ran, in all
and for the K kernel pairs (the one before, the one after) that left the most of it.
Kernels of a graph overlap, so gaps say most about passes outside graphs."""
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


def read(path):
    """(start, end, graph id, grid, name) per record, by start time."""
    recs = []
    with open(path) as f:
        for line in f:
            p = line.split(None, 5)
            if len(p) < 6:
                continue
            recs.append((int(p[0]), int(p[1]), int(p[2]), int(p[4]), p[5].strip()))
    recs.sort()
    return recs


def graph_launch(recs, gid, launch):
    """One launch of graph gid (the launches are told apart by gaps of > 20 us)."""
    by_graph = defaultdict(list)
    for r in recs:
        if r[2]:
            by_graph[r[2]].append(r)
    if not by_graph:
        sys.exit("trace_summary: no graph kernels in the trace")
    if gid is None:
        gid = max(by_graph, key=lambda g: len(by_graph[g]))
    if gid not in by_graph:
        sys.exit(f"trace_summary: no graph {gid} in the trace (graphs: {sorted(by_graph)})")
    launches, cur, last_end = [], [], 0
    for r in by_graph[gid]:
        if cur and r[0] - last_end > 20000:
            launches.append(cur)
            cur = []
        last_end = max(last_end, r[1]) if cur else r[1]
        cur.append(r)
    launches.append(cur)
    li = launch if launch is not None else len(launches) // 2
    if not -len(launches) <= li < len(launches):
        sys.exit(f"trace_summary: graph {gid} has {len(launches)} launches")
    return f"graph {gid}: {len(launches)} launches of {len(launches[li])} kernels; launch {li}", launches[li]


def forward_pass(recs, n):
    """Forward pass n of the kernels outside graphs after the last graph launch."""
    last = max((i for i, r in enumerate(recs) if r[2]), default=-1)
    passes = []
    for r in recs[last + 1:]:
        if short(r[4]) == 'embed_kernel':
            passes.append([])
        if passes:
            passes[-1].append(r)
    if not -len(passes) <= n < len(passes):
        sys.exit(f"trace_summary: {len(passes)} forward passes outside graphs after the last graph launch")
    return f"pass {n} of {len(passes)} outside graphs: {len(passes[n])} kernels", passes[n]


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith('-'):
        print(__doc__)
        return 2

    def opt(name):
        if name not in args:
            return None
        i = args.index(name)
        if i + 1 >= len(args):
            sys.exit(f"trace_summary: {name} needs a number")
        try:
            return int(args[i + 1])
        except ValueError:
            sys.exit(f"trace_summary: {name} needs a number, not '{args[i + 1]}'")

    try:
        recs = read(args[0])
    except OSError as e:
        sys.exit(f"trace_summary: cannot read {args[0]}: {e.strerror}")
    pn, k = opt('--pass'), opt('--gaps')
    title, run = forward_pass(recs, pn) if pn is not None else graph_launch(recs, opt('--graph'), opt('--launch'))
    t0 = run[0][0]
    total = max(r[1] for r in run) - t0
    adv, busy, cnt = defaultdict(int), defaultdict(int), defaultdict(int)
    front = t0
    for r in run:
        n = short(r[4])
        adv[n] += max(0, r[1] - front)
        front = max(front, r[1])
        busy[n] += r[1] - r[0]
        cnt[n] += 1
    print(f"{title}: {total / 1000:.1f} us")
    print(f"{'kernel':42s} {'count':>5s} {'advance us':>11s} {'share':>6s} {'busy us':>9s}")
    for n in sorted(adv, key=lambda n: -adv[n]):
        print(f"{n:42s} {cnt[n]:5d} {adv[n] / 1000:11.1f} {100 * adv[n] / total:5.1f}% {busy[n] / 1000:9.1f}")
    if k is not None:
        gap, gn = defaultdict(int), defaultdict(int)
        front = run[0][1]
        for prev, r in zip(run, run[1:]):
            if r[0] > front:
                pair = (short(prev[4]), short(r[4]))
                gap[pair] += r[0] - front
                gn[pair] += 1
            front = max(front, r[1])
        idle = sum(gap.values())
        print(f"idle {idle / 1000:.1f} us of {total / 1000:.1f} ({100 * idle / total:.1f}%)")
        print(f"{'after':34s} {'before':34s} {'count':>5s} {'idle us':>8s} {'each':>6s}")
        for pair in sorted(gap, key=lambda p: -gap[p])[:k]:
            print(f"{pair[0][:34]:34s} {pair[1][:34]:34s} {gn[pair]:5d} {gap[pair] / 1000:8.1f} {gap[pair] / gn[pair] / 1000:6.2f}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
