#!/usr/bin/env python3
"""kiln vs ONNX Runtime on the bench/blocks.py transformer blocks.

    /work/main/.venv/bin/python bench/blocks_bench.py KILN DIR [--rounds R]
        [--time S] [--only bert_o13,gpt2_o17] [--batches 1,16] [--threads 1,2]
        [--base KILN0 DIR0]

DIR holds NAME_bB.onnx from blocks.py and NAME_bB.so compiled by kiln.  Each
round times every configuration once with kiln (its own `kiln bench`
process) then ORT (intra_op_num_threads=T, sequential, as bench.py does),
alternately, so both see the same machine load; prints per configuration the
median over rounds of each side's median, the min, and the ratio of medians.
--base also times an older kiln's libraries (DIR0/NAME_bB.so) in the same
rounds, for a before/after table under the same load.
"""
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort


def timed(fn, seconds, warmup=3):
    for _ in range(warmup):
        fn()
    t = []
    start = time.perf_counter()
    while len(t) < 5 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t), min(t)


def ort_ms(onnx, b, threads, seconds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
    i = s.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal([b] + i.shape[1:]).astype(np.float32)
    r = timed(lambda: s.run(None, {i.name: x}), seconds)
    del s
    time.sleep(0.05)
    return r


def kiln_ms(kiln, so, b, threads, seconds):
    out = subprocess.run([kiln, "bench", so, "--batch", str(b), "--threads", str(threads),
                          "--time", str(seconds), "--json"], capture_output=True, text=True,
                         check=True).stdout
    j = json.loads(out)
    return j["median_ms"], j["min_ms"]


def main():
    a = sys.argv[1:]
    kiln, d = a[0], a[1]

    def opt(name, dflt):
        return a[a.index(name) + 1] if name in a else dflt
    rounds = int(opt("--rounds", "3"))
    secs = float(opt("--time", "1.5"))
    names = opt("--only", "bert_o13,bert_o17,gpt2_o13,gpt2_o17").split(",")
    batches = [int(x) for x in opt("--batches", "1,16").split(",")]
    threads = [int(x) for x in opt("--threads", "1,2").split(",")]
    configs = [(n, b, t) for n in names for b in batches for t in threads]
    base = (a[a.index("--base") + 1], a[a.index("--base") + 2]) if "--base" in a else None
    res = {c: ([], [], [], [], [], []) for c in configs}
    for _ in range(rounds):
        for c in configs:
            n, b, t = c
            km, kmin = kiln_ms(kiln, f"{d}/{n}_b{b}.so", b, t, secs)
            om, omin = ort_ms(f"{d}/{n}_b{b}.onnx", b, t, secs)
            r = res[c]
            r[0].append(km), r[1].append(kmin), r[2].append(om), r[3].append(omin)
            if base:
                bm, bmin = kiln_ms(base[0], f"{base[1]}/{n}_b{b}.so", b, t, secs)
                r[4].append(bm), r[5].append(bmin)
    print(f"{'model':10} {'b':>3} {'t':>2} {'kiln ms':>9} {'(min)':>9} {'ORT ms':>9} "
          f"{'(min)':>9} {'ratio':>6} {'min-ratio':>9}" +
          (f" {'base ms':>9} {'(min)':>9} {'base ratio':>10} {'base min-ratio':>14}" if base else ""))
    for c in configs:
        n, b, t = c
        km, kmin, om, omin = (statistics.median(res[c][0]), min(res[c][1]),
                              statistics.median(res[c][2]), min(res[c][3]))
        extra = ""
        if base:
            bm, bmin = statistics.median(res[c][4]), min(res[c][5])
            extra = f" {bm:9.2f} {bmin:9.2f} {bm / om:10.2f} {bmin / omin:14.2f}"
        print(f"{n:10} {b:3} {t:2} {km:9.2f} {kmin:9.2f} {om:9.2f} {omin:9.2f} "
              f"{km / om:6.2f} {kmin / omin:9.2f}" + extra, flush=True)


if __name__ == "__main__":
    main()
