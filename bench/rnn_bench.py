#!/usr/bin/env python3
"""kiln's fused LSTM vs ONNX Runtime on a 1-layer LSTM classifier.

    .venv/bin/python bench/rnn_bench.py KILN DIR [--time S] [--seq 64] [--batches 1,16]

The model: nn.LSTM(32, 128, batch_first=True) and a Linear(128, 10) on the
last step, exported by torch (opset 17) once per batch with a fixed batch
and a dynamic sequence length "T", so kiln imports one fused LSTM (the
symbolic T is what `kiln bench --batch` sets: here the sequence length),
and once more with T fixed, which kiln imports unrolled (~25 nodes per
step).  One thread everywhere: `KILN bench --json` on each library and ORT
(default graph optimisation, one intra-op thread) on the dynamic export;
the three runs of a row alternate, twice each, and the medians' medians
are printed (ms per run), with kiln fused / ORT (below 1: kiln faster).
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np
import onnxruntime as ort
import torch

FEAT, HIDDEN, CLASSES = 32, 128, 10


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(FEAT, HIDDEN, batch_first=True)
        self.fc = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1, :])


def kiln_time(kiln, so, sym, secs):
    out = subprocess.run([kiln, "bench", so, "--batch", str(sym), "--threads", "1",
                          "--time", str(secs), "--json"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.splitlines()[0])["median_ms"]


def ort_time(sess, x, secs):
    for _ in range(5):
        sess.run(None, {"x": x})
    ts, end = [], time.time() + secs
    while time.time() < end or len(ts) < 10:
        t = time.perf_counter()
        sess.run(None, {"x": x})
        ts.append(time.perf_counter() - t)
    return 1000 * statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("dir")
    ap.add_argument("--time", type=float, default=1.5)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batches", default="1,16")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    torch.manual_seed(0)
    model = Classifier().eval()
    o = ort.SessionOptions()
    o.intra_op_num_threads = o.inter_op_num_threads = 1
    o.log_severity_level = 3
    print(f"LSTM({FEAT}, {HIDDEN}) + Linear, T {a.seq}, one thread; ms per run (median)")
    print("batch  kiln fused  kiln unrolled  ORT     fused/ORT")
    for b in (int(v) for v in a.batches.split(",")):
        paths = {}
        for kind, axes in (("dyn", {"x": {1: "T"}}), ("fixed", {})):
            onnx = os.path.join(a.dir, f"lstm_b{b}_{kind}.onnx")
            torch.onnx.export(model, (torch.randn(b, a.seq, FEAT),), onnx, opset_version=17,
                              input_names=["x"], output_names=["logits"], dynamic_axes=axes)
            so = onnx[:-5] + ".so"
            subprocess.run([a.kiln, "compile", onnx, "-o", so], check=True, capture_output=True)
            paths[kind] = (onnx, so)
        sess = ort.InferenceSession(paths["dyn"][0], o, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).random((b, a.seq, FEAT), dtype=np.float32)
        t = {"fused": [], "unrolled": [], "ort": []}
        for _ in range(2):
            t["fused"].append(kiln_time(a.kiln, paths["dyn"][1], a.seq, a.time))
            t["unrolled"].append(kiln_time(a.kiln, paths["fixed"][1], 1, a.time))
            t["ort"].append(ort_time(sess, x, a.time))
        m = {k: statistics.median(v) for k, v in t.items()}
        print(f"{b:5d}  {m['fused']:10.3f}  {m['unrolled']:13.3f}  {m['ort']:6.3f}  "
              f"{m['fused'] / m['ort']:9.2f}")


if __name__ == "__main__":
    main()
