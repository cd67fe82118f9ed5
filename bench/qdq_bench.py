#!/usr/bin/env python3
"""kiln int8 vs kiln f32 vs ONNX Runtime int8 and f32, side by side.

    .venv/bin/python bench/qdq_bench.py KILN DIR [--time S] [--batches 1,16]

DIR holds NAME.onnx and NAME.qdq.onnx pairs, as tests/onnx/check_qdq.py
writes them (an f32 export and ONNX Runtime's quantize_static QDQ model of
it).  For each pair and batch, one thread: compiles both with `KILN
compile` (the QDQ one through the qfuse pass onto kiln's 8-bit kernels),
times them with `KILN bench --json`, and times ORT 1.x on both files with
its default (full) graph optimisation, one intra-op thread.  The four runs
of a row alternate, twice each, and the medians' medians are printed with
the ratios docs/QUANTIZATION.md quotes:
  int8 speedup  = kiln f32 / kiln int8
  vs ORT int8   = kiln int8 / ORT int8 (below 1: kiln faster)
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort


def kiln_time(kiln, so, batch, secs):
    out = subprocess.run([kiln, "bench", so, "--batch", str(batch), "--threads", "1",
                          "--time", str(secs), "--json"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.splitlines()[0])["median_ms"]


def ort_session(path):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    o.log_severity_level = 3
    return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])


def ort_time(sess, batch, secs):
    inp = sess.get_inputs()[0]
    shape = [batch if not isinstance(d, int) else d for d in inp.shape]
    shape[0] = batch
    x = {inp.name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    for _ in range(5):
        sess.run(None, x)
    ts, end = [], time.time() + secs
    while time.time() < end or len(ts) < 10:
        t = time.perf_counter()
        sess.run(None, x)
        ts.append(time.perf_counter() - t)
    return 1000 * statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("dir")
    ap.add_argument("--time", type=float, default=1.5)
    ap.add_argument("--batches", default="1,16")
    a = ap.parse_args()
    rows = []
    for qdq in sorted(glob.glob(os.path.join(a.dir, "*.qdq.onnx"))):
        name = os.path.basename(qdq)[:-len(".qdq.onnx")]
        f32 = os.path.join(a.dir, name + ".onnx")
        if not os.path.exists(f32):
            continue
        so = {}
        for k, path in (("f32", f32), ("int8", qdq)):
            so[k] = os.path.join(a.dir, f"{name}.bench.{k}.so")
            subprocess.run([a.kiln, "compile", path, "-o", so[k]], check=True,
                           capture_output=True)
        sess = {"f32": ort_session(f32), "int8": ort_session(qdq)}
        for b in (int(x) for x in a.batches.split(",")):
            t = {k: [] for k in ("kf32", "kint8", "of32", "oint8")}
            for _ in range(2):
                t["kf32"].append(kiln_time(a.kiln, so["f32"], b, a.time))
                t["kint8"].append(kiln_time(a.kiln, so["int8"], b, a.time))
                t["of32"].append(ort_time(sess["f32"], b, a.time))
                t["oint8"].append(ort_time(sess["int8"], b, a.time))
            m = {k: statistics.median(v) for k, v in t.items()}
            rows.append((name, b, m))
            print(f"{name} b{b} t1: kiln f32 {m['kf32']:.2f} ms, kiln int8 {m['kint8']:.2f} ms, "
                  f"ORT f32 {m['of32']:.2f} ms, ORT int8 {m['oint8']:.2f} ms; "
                  f"int8 speedup {m['kf32'] / m['kint8']:.2f}x, "
                  f"kiln int8 / ORT int8 {m['kint8'] / m['oint8']:.2f}", flush=True)
    print("\n| model | batch | kiln f32 ms | kiln int8 ms | ORT f32 ms | ORT int8 ms | "
          "int8 speedup | kiln int8 / ORT int8 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, b, m in rows:
        print(f"| {name} | {b} | {m['kf32']:.2f} | {m['kint8']:.2f} | {m['of32']:.2f} | "
              f"{m['oint8']:.2f} | {m['kf32'] / m['kint8']:.2f}x | {m['kint8'] / m['oint8']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
