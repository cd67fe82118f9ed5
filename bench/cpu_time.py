#!/usr/bin/env python3
"""CPU time per inference, kiln against ONNX Runtime, one thread.

    .venv/bin/python bench/cpu_time.py --kiln build-bench/kiln MODEL.onnx [MODEL.onnx ...]
        [--batch B] [--runs R] [--rounds N]

On a shared machine (other jobs on the same cores) wall-clock medians move
by 10-50% between runs; the CPU time a one-thread run consumes moves far
less.  For kiln: `kiln bench` is run twice, with R and 4R timed runs, and
the difference of the two processes' user+sys time (os.wait4) divided by
3R is the cost of one run, free of compile, load and warm-up.  For ORT: a
session with intra_op_num_threads=1 in this process, resource.getrusage
around 3R runs after a warm-up.  Both are measured N times alternating
(--rounds, default 3) and the median of each kept: single rounds moved a
model's ratio by 10-20% here (kiln's estimate is a difference of two
runs, so its minimum would be biased low).  Prints kiln ms, ORT ms, their
ratio and kiln's compile time (wall).
Numbers at two threads need a quiet machine: use bench/run.sh.
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def kiln_cpu(kiln, so, batch, runs):
    def one(n):
        p = subprocess.Popen([kiln, "bench", so, "--batch", str(batch), "--threads", "1",
                              "--runs", str(n), "--warmup", "2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        if status != 0:
            raise RuntimeError(f"kiln bench {so} failed ({status})")
        return ru.ru_utime + ru.ru_stime
    return (one(4 * runs) - one(runs)) / (3 * runs) * 1e3


def ort_cpu(path, batch, runs):
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in s.get_inputs():
        shape = [batch if not isinstance(d, int) else d for d in i.shape]
        feeds[i.name] = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(3):
        s.run(None, feeds)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(3 * runs):
        s.run(None, feeds)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return ((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)) / (3 * runs) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for path in a.models:
            name = os.path.splitext(os.path.basename(path))[0]
            so = os.path.join(d, name + ".so")
            t0 = time.monotonic()
            subprocess.run([a.kiln, "compile", path, "-o", so], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ct = time.monotonic() - t0
            ks, os_ = [], []
            for _ in range(max(1, a.rounds)):
                ks.append(kiln_cpu(a.kiln, so, a.batch, a.runs))
                os_.append(ort_cpu(path, a.batch, a.runs))
            k, o = statistics.median(ks), statistics.median(os_)
            print(f"{name:24s} b{a.batch}  kiln {k:9.3f} ms  ORT {o:9.3f} ms  kiln/ORT {k / o:5.2f}"
                  f"  (compile {ct:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
