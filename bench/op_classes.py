#!/usr/bin/env python3
"""Where one model's batch-1, one-thread time goes, kiln beside ONNX Runtime,
by class of operator.

    .venv/bin/python bench/op_classes.py --kiln build-bench/kiln MODEL.onnx [--runs R] [--layers]

kiln: `kiln compile` (the library and its --emit=kir), then `kiln bench
--profile --json`; each kernel is classed by the GEMM it calls (`gemm N=49`:
a 1x1 conv on a 7x7 map, or an im2col conv's), else by its op (`dwconv`:
a conv kernel with no GEMM, that is a depthwise, grouped or Winograd
stage; `batch_norm`, `concat` ...).  ORT: a session with profiling on,
intra_op_num_threads=1; each node's kernel time is classed by op, a Conv by
its kernel size and output pixels (`conv k1 N=49`) or as `dwconv` when its
weight has one input channel per group.  The classes do not match one to one
(Winograd's stages count as kiln's dwconv, ORT's NCHWc reorders as their own
op), but a class far from its counterpart says where to look: this is how
MobileNetV2's stride-2 depthwise convs (2.4-3.4x ORT each) and DenseNet's
Relu kernels after its BatchNorms were found.  --layers prints kiln's conv
kernels without a GEMM and ORT's depthwise convs one per line, in order.
CPU time is not taken: run on a quiet machine.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile


def kiln_classes(kiln, model, runs, layers):
    with tempfile.TemporaryDirectory() as d:
        so, kir = os.path.join(d, "m.so"), os.path.join(d, "m.kir")
        for out, extra in ((so, []), (kir, ["--emit=kir"])):
            subprocess.run([kiln, "compile", model, "-o", out] + extra, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = subprocess.run([kiln, "bench", so, "--threads", "1", "--runs", str(runs),
                              "--profile", "--json"], check=True, capture_output=True,
                             text=True).stdout
        prof = json.loads(out.splitlines()[-1])["profile"]
        text = open(kir).read()
    bodies = {m.group(1): m.group(2) for m in
              re.finditer(r"kernel (k\d+_\w+) \(node \d+\)[^{]*\{\n(.*?)\n\}\n", text, re.S)}
    cls = collections.defaultdict(float)
    for e in prof:
        g = re.search(r"gemm M=(\S+) N=(\S+) K=(\S+)", bodies.get(e["kernel"], ""))
        if g:
            kind = "gemm N=" + g.group(2)
        elif e["kernel"].endswith("_conv"):
            kind = "dwconv"
            if layers:
                print(f"  kiln {e['kernel']:12s} {e['ms']:.4f} ms")
        else:
            kind = e["kernel"].split("_", 1)[1]
        cls[kind] += e["ms"]
    return cls


def ort_classes(model, runs, layers):
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as d:
        so.profile_file_prefix = os.path.join(d, "ort")
        s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        feeds = {}
        for i in s.get_inputs():
            shape = [1 if not isinstance(v, int) else v for v in i.shape]
            feeds[i.name] = np.random.default_rng(0).random(shape, dtype=np.float32)
        for _ in range(runs):
            s.run(None, feeds)
        events = json.load(open(s.end_profiling()))
    cls = collections.defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        a = e.get("args", {})
        op = a.get("op_name", "?")
        if op == "Conv":
            try:
                w = list(a["input_type_shape"][1].values())[0]
                y = list(a["output_type_shape"][0].values())[0]
                op = "dwconv" if w[1] == 1 else f"conv k{w[2]} N={y[2] * y[3]}"
                if layers and op == "dwconv":
                    print(f"  ORT  {e['name'][:40]:40s} {e['dur'] / 1e3:.4f} ms  out {y}")
            except (KeyError, IndexError, TypeError):
                op = "Conv"
        cls[op] += e["dur"] / 1e3 / runs
    return cls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("model")
    a = ap.parse_args()
    k = kiln_classes(a.kiln, a.model, a.runs, a.layers)
    o = ort_classes(a.model, a.runs, a.layers)
    print(f"{'kiln class':24s} {'ms':>8s}    {'ORT class':24s} {'ms':>8s}")
    ks = sorted(k.items(), key=lambda x: -x[1])
    os_ = sorted(o.items(), key=lambda x: -x[1])
    for i in range(max(len(ks), len(os_))):
        left = f"{ks[i][0]:24s} {ks[i][1]:8.3f}" if i < len(ks) else " " * 33
        right = f"{os_[i][0]:24s} {os_[i][1]:8.3f}" if i < len(os_) else ""
        print(f"{left}    {right}")
    print(f"{'total':24s} {sum(k.values()):8.3f}    {'total':24s} {sum(o.values()):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
