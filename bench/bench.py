#!/usr/bin/env python3
"""kiln vs ONNX Runtime vs PyTorch, side by side in one run.

    .venv/bin/python bench/bench.py --kiln BUILD/kiln --models DIR [--quick]
                                    [--time S] [--out docs/PERFORMANCE.md]

DIR holds bench/models.py's exports.  Each model is compiled once with
`kiln compile` (timed), then for every batch (1, 16) and thread count (1, 2):
kiln through `kiln bench --json` (its own process: warm-up, then as many
runs as fit in S seconds, median), ONNX Runtime (intra_op_num_threads = T,
sequential execution, all graph optimisations) and PyTorch 1.13
(torch.set_num_threads(T), inference mode) on the same random input, timed
the same way in this process.  Writes the median latencies and the ratios
kiln/ORT and kiln/PyTorch into the output Markdown, with the GEMM kernel
benchmark when BUILD/gemm_bench exists, the machine and the command.  A
section of the existing output headed "## Notes" and everything after it is
hand-written and kept.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def timed(fn, seconds, warmup=5):
    """Median ms of fn() over as many runs as fit in seconds (>= 10)."""
    for _ in range(warmup):
        fn()
    t = []
    start = time.perf_counter()
    while len(t) < 10 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


def compile_model(kiln, onnx, so):
    t0 = time.perf_counter()
    r = subprocess.run([kiln, "compile", onnx, "-o", so], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    return dt, None


def kiln_ms(kiln, so, batch, threads, seconds):
    r = subprocess.run([kiln, "bench", so, "--batch", str(batch), "--threads", str(threads),
                        "--time", str(seconds), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads(r.stdout.strip().splitlines()[-1])["median_ms"], None


def ort_ms(ort, onnx, x, threads, seconds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
    feed = {s.get_inputs()[0].name: x}
    ms = timed(lambda: s.run(None, feed), seconds)
    del s
    time.sleep(0.05)  # let its spinning workers wind down
    return ms


def torch_ms(torch, module, x, threads, seconds):
    torch.set_num_threads(threads)
    xt = torch.from_numpy(x)
    with torch.inference_mode():
        return timed(lambda: module(xt), seconds)


LOAD_AT_START = os.getloadavg()[0]


def machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
            f"load average {LOAD_AT_START:.1f} at the start of the run and "
            f"{os.getloadavg()[0]:.1f} at the end (anything above 0 is other work competing "
            f"for the CPUs)")


def fmt(v, digits=3):
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


def run(args):
    import numpy as np
    import onnxruntime as ort
    import torch
    names = models.QUICK if args.quick else tuple(models.SHAPES)
    rows, compiled, notes = [], {}, []
    for name in names:
        shape, _ = models.SHAPES[name]
        module = models.build(torch, name)
        for batch in models.BATCHES:
            onnx = os.path.join(args.models, models.onnx_name(name, batch))
            so = os.path.join(args.work, os.path.basename(onnx)[:-5] + ".so")
            if onnx not in compiled:
                compiled[onnx], err = compile_model(args.kiln, onnx, so)
                if err:
                    notes.append(f"{os.path.basename(onnx)}: kiln compile failed: {err}")
            x = np.random.default_rng(0).standard_normal((batch, *shape), dtype=np.float32)
            for threads in (1, 2):
                k = None
                if compiled[onnx] is not None:
                    k, err = kiln_ms(args.kiln, so, batch, threads, args.time)
                    if err:
                        notes.append(f"{name} b{batch} t{threads}: kiln bench failed: {err}")
                # PyTorch before ORT: ORT's idle workers spin for a while after
                # a run, and would steal the CPUs from whatever runs next
                p = torch_ms(torch, module, x, threads, args.time)
                o = ort_ms(ort, onnx, x, threads, args.time)
                rows.append((name, batch, threads, k, o, p))
                print(f"{name:13} b{batch:<3} t{threads}  kiln {fmt(k)}  ort {fmt(o)}  "
                      f"torch {fmt(p)} ms", flush=True)
    return rows, compiled, notes, ort.__version__, torch.__version__


def gemm_section(build):
    exe = os.path.join(build, "gemm_bench")
    if not os.access(exe, os.X_OK):
        return ["GEMM kernel benchmark: `gemm_bench` was not built in this run."]
    r = subprocess.run([exe], capture_output=True, text=True)
    return ["```", (r.stdout + r.stderr).strip(), "```"]


NOTES = "## Notes"


def kept_notes(path):
    """The hand-written tail of the output from its NOTES heading on, which
    a rerun keeps (history, analysis), or ""."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    at = text.find("\n" + NOTES + "\n")
    return "\n" + text[at + 1:] if at >= 0 else ""


def write(args, rows, compiled, notes, ort_v, torch_v):
    L = ["# Performance", "",
         "Median latency in ms of one inference (lower is better), measured side by side",
         "in one run by `bench/run.sh`; ratios below 1 mean kiln is faster.", "",
         f"- Machine: {machine()}",
         f"- ONNX Runtime {ort_v} (CPU provider, intra-op threads = T, sequential), "
         f"PyTorch {torch_v} (set_num_threads(T), inference mode)",
         f"- Command: `{' '.join(args.command)}`", "",
         "| model | batch | threads | kiln | ORT | PyTorch | kiln/ORT | kiln/PyTorch |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, b, t, k, o, p in rows:
        L.append(f"| {name} | {b} | {t} | {fmt(k)} | {fmt(o)} | {fmt(p)} | {ratio(k, o)} | "
                 f"{ratio(k, p)} |")
    L += ["", "## Compile time (`kiln compile`, wall clock)", ""]
    for onnx, dt in compiled.items():
        L.append(f"- {os.path.basename(onnx)}: {fmt(dt, 2)} s")
    L += ["", "## GEMM kernel", ""] + gemm_section(os.path.dirname(args.kiln))
    if notes:
        L += ["", "## Failures", ""] + [f"- {n}" for n in notes]
    kept = kept_notes(args.out)
    with open(args.out, "w") as f:
        f.write("\n".join(L) + "\n" + kept)
    print(f"bench.py: wrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", default=None, help="where compiled .so files go")
    ap.add_argument("--out", default="docs/PERFORMANCE.md")
    ap.add_argument("--time", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--command", nargs="*", default=None)
    args = ap.parse_args()
    args.work = args.work or args.models
    args.command = args.command or sys.argv
    write(args, *run(args))


if __name__ == "__main__":
    main()
