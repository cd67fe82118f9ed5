#!/usr/bin/python3
"""Two kiln compilers (or two sets of compile flags) on one model, side by
side: each compiles MODEL.onnx, then their libraries are timed in
alternating rounds, so both see the same machine load.

    /usr/bin/python3 bench/ab.py MODEL.onnx --a KILN_A [--b KILN_B]
        [--af=FLAGS] [--bf=FLAGS] [--batch B] [--threads T]
        [--rounds R] [--time S] [--nodes]

KILN_A is usually an older build (`git worktree add /tmp/wt REV` and a
Release build there, or a copy of build-bench/kiln taken before a
change); KILN_B defaults to build-bench/kiln; --bf=--conv=im2col (with the
"=": the flags start with a dash) times a lowering choice against the
default.  Without --nodes: `kiln bench
--json` per round, and the median over rounds of each side's median and
the min of its mins, with their ratios B/A.  With --nodes: `kiln bench
--profile --json` per round, each kernel's time charged to the graph node
`kiln compile --emit=kir` names for it, and per node the min over rounds:
nodes are the same on both sides even where the kernels are not (a fold
removes a kernel and renumbers the rest).  Medians of whole runs move by
10-30% on a shared machine; per-node mins over 5 rounds were steady to a
few percent (docs/PERFORMANCE.md, 2026-12-04 afternoon).
"""
import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_lib(kiln, model, flags, out):
    subprocess.run([kiln, "compile", model, "-o", out] + flags.split(), check=True,
                   capture_output=True)
    subprocess.run([kiln, "compile", model, "--emit=kir", "-o", out + ".kir"] + flags.split(),
                   check=True, capture_output=True)
    nodes = {}
    with open(out + ".kir") as f:
        for line in f:
            m = re.match(r"kernel (\S+) \(node (\d+)\)", line)
            if m:
                nodes[m.group(1)] = int(m.group(2))
    return nodes


def bench(kiln, lib, a, profile):
    cmd = [kiln, "bench", lib, "--batch", str(a.batch), "--threads", str(a.threads), "--time",
           str(a.time), "--json"] + (["--profile"] if profile else [])
    lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    return json.loads(lines[0]), json.loads(lines[1]) if profile else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--a", required=True, help="kiln A")
    ap.add_argument("--b", default=os.path.join(ROOT, "build-bench", "kiln"), help="kiln B")
    ap.add_argument("--af", default="", help="A's extra compile flags")
    ap.add_argument("--bf", default="", help="B's extra compile flags")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--time", type=float, default=1.0)
    ap.add_argument("--nodes", action="store_true", help="per-node kernel time")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-ab-")
    side = {"A": (a.a, a.af), "B": (a.b, a.bf)}
    lib, nodes = {}, {}
    for s, (kiln, flags) in side.items():
        lib[s] = os.path.join(tmp, s + ".so")
        nodes[s] = compile_lib(kiln, a.model, flags, lib[s])
    runs = {"A": [], "B": []}
    per = {"A": collections.defaultdict(list), "B": collections.defaultdict(list)}
    for _ in range(a.rounds):
        for s in "AB":  # each side's library is run by B's kiln bench: one harness
            summary, prof = bench(a.b, lib[s], a, a.nodes)
            runs[s].append((summary["median_ms"], summary["min_ms"]))
            if prof:
                acc = collections.defaultdict(float)
                for k in prof["profile"]:
                    acc[nodes[s].get(k["kernel"], -1)] += k["ms"]
                for n, ms in acc.items():
                    per[s][n].append(ms)
    name = os.path.basename(a.model)
    med = {s: statistics.median(r[0] for r in runs[s]) for s in "AB"}
    mn = {s: min(r[1] for r in runs[s]) for s in "AB"}
    print(f"{name} batch {a.batch} threads {a.threads}, {a.rounds} rounds:")
    for s in "AB":
        print(f"  {s}: median {med[s]:.4f} ms  min {mn[s]:.4f} ms")
    print(f"  B/A: median {med['B'] / med['A']:.3f}  min {mn['B'] / mn['A']:.3f}")
    if a.nodes:
        ta = tb = 0.0
        order = sorted(set(per["A"]) | set(per["B"]), key=lambda n: -min(per["A"].get(n, [0])))
        for n in order:
            va, vb = min(per["A"].get(n, [0])), min(per["B"].get(n, [0]))
            ta, tb = ta + va, tb + vb
            if max(va, vb) >= 0.02:
                ratio = f"{vb / va:6.2f}" if va else "     -"
                print(f"  node {n:5d}  A {va:9.4f}  B {vb:9.4f}  B/A {ratio}")
        print(f"  kernels, sum of per-node mins: A {ta:.3f} ms  B {tb:.3f} ms  B/A {tb / ta:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
