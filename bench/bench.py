#!/usr/bin/env python3
"""kiln vs ONNX Runtime vs PyTorch, side by side in one run.

    .venv/bin/python bench/bench.py --kiln BUILD/kiln --models DIR [--quick]
                                    [--only NAME[,NAME...]] [--time S]
                                    [--out docs/PERFORMANCE.md]

DIR holds bench/models.py's exports.  Each model is compiled once with
`kiln compile` (timed), then for every batch (1, 16) and thread count (1, 2):
kiln through `kiln bench --json` (its own process: warm-up, then as many
runs as fit in S seconds, median), ONNX Runtime (intra_op_num_threads = T,
sequential execution, all graph optimisations; in a child process of its
own that loads only numpy and onnxruntime, timed as below) and PyTorch 1.13
(torch.set_num_threads(T), inference mode) on the same random input, timed
the same way in this process.  kiln and ORT run in R alternating rounds
(--rounds, default 3) and each keeps its best median: on a shared machine
another job can hold a core through one side's run.  The peak RSS of the kiln bench process and
of the ORT child is kept for each run: each reports its own VmHWM (the
high-water mark of its address space).  Not ru_maxrss from wait4 or
RUSAGE_CHILDREN: Linux carries a parent's peak into a child it forks (or
vforks) and the child's exec keeps it, so every child of this process, which
holds PyTorch, would show at least this process's peak.  Writes the
median latencies and the ratios kiln/ORT and kiln/PyTorch into the output
Markdown, a table of peak RSS, the GEMM kernel benchmark when
BUILD/gemm_bench exists, the machine and the command.  A section of the
existing output headed "## Notes" and everything after it is hand-written
and kept.

--only times just the models named (bench/models.py's names); the table
then goes to stdout unless --out is given, so that a partial run does not
replace docs/PERFORMANCE.md.
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


def peak_rss_mib():
    """This process's peak resident set in MiB (VmHWM), None if unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def child_json(cmd):
    """Runs cmd; (its last stdout line as JSON, None) or (None, why)."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def rss_of(j):
    """(peak, start) RSS MiB from a child's JSON, None when it has none."""
    peak, start = j.get("peak_rss_mib"), j.get("start_rss_mib")
    ok = all(v is not None and v >= 0 for v in (peak, start))
    return (peak, start) if ok else None


def kiln_ms(kiln, so, batch, threads, seconds):
    """(median ms, (peak, start) RSS MiB, error) of `kiln bench`, in its own
    process; start is its peak before it loaded the library."""
    j, why = child_json([kiln, "bench", so, "--batch", str(batch), "--threads", str(threads),
                         "--time", str(seconds), "--json"])
    return (None, None, why) if why else (j["median_ms"], rss_of(j), None)


def ort_child_ms(name, onnx, batch, threads, seconds):
    """(median ms, (peak, start) RSS MiB, error) of ONNX Runtime in a child
    process (this script's --ort-child mode); start is its peak once
    Python, numpy and onnxruntime are loaded, before the session."""
    j, why = child_json([sys.executable, os.path.abspath(__file__), "--ort-child", name, onnx,
                         str(batch), str(threads), str(seconds)])
    return (None, None, why) if why else (j["median_ms"], rss_of(j), None)


def bench_input(name, batch):
    shape, _ = models.SHAPES[name]
    import numpy as np
    return np.random.default_rng(0).standard_normal((batch, *shape), dtype=np.float32)


def ort_child_main(argv):
    """--ort-child NAME ONNX BATCH THREADS SECONDS: time ORT on the bench
    input; print {"median_ms", "peak_rss_mib", "start_rss_mib"}."""
    name, onnx, batch, threads, seconds = argv
    import numpy  # noqa: F401
    import onnxruntime as ort
    start = peak_rss_mib()
    ms = ort_ms(ort, onnx, bench_input(name, int(batch)), int(threads), float(seconds))
    print(json.dumps({"median_ms": ms, "peak_rss_mib": peak_rss_mib(), "start_rss_mib": start}))
    return 0


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
    import onnxruntime as ort
    import torch
    rows, compiled, notes = [], {}, []
    for name in args.names:
        module = models.build(torch, name)
        for batch in models.BATCHES:
            onnx = os.path.join(args.models, models.onnx_name(name, batch))
            so = os.path.join(args.work, os.path.basename(onnx)[:-5] + ".so")
            if onnx not in compiled:
                compiled[onnx], err = compile_model(args.kiln, onnx, so)
                if err:
                    notes.append(f"{os.path.basename(onnx)}: kiln compile failed: {err}")
            x = bench_input(name, batch)
            for threads in (1, 2):
                k = kr = o = orr = None
                kfail = compiled[onnx] is None
                # kiln and ORT in alternating rounds, each side's best
                # median kept: on a shared machine another job can hold a
                # core through one side's run (MobileNetV2 b1 t2 ran 8.5 ms
                # once inside this loop and 5.3-5.6 alone, both sides
                # alike), and the best of a few rounds is the side's own
                # speed.  PyTorch, the slow reference, runs once.
                for rnd in range(args.rounds):
                    if not kfail:
                        k1, kr1, err = kiln_ms(args.kiln, so, batch, threads, args.time)
                        if err:
                            notes.append(f"{name} b{batch} t{threads}: kiln bench failed: {err}")
                            kfail, k, kr = True, None, None
                        elif k is None or k1 < k:
                            k, kr = k1, kr1
                    # PyTorch before ORT: ORT's idle workers spin for a while
                    # after a run and would steal the CPUs from whatever ran
                    # next (they now end with ORT's child process, but the
                    # order stays)
                    if rnd == 0:
                        p = torch_ms(torch, module, x, threads, args.time)
                    o1, orr1, err = ort_child_ms(name, onnx, batch, threads, args.time)
                    if err:
                        notes.append(f"{name} b{batch} t{threads}: ONNX Runtime failed: {err}")
                        break
                    if o is None or o1 < o:
                        o, orr = o1, orr1
                rows.append((name, batch, threads, k, o, p, kr, orr))
                print(f"{name:18} b{batch:<3} t{threads}  kiln {fmt(k)}  ort {fmt(o)}  "
                      f"torch {fmt(p)} ms;  peak RSS kiln {fmt(kr and kr[0], 0)}  "
                      f"ort {fmt(orr and orr[0], 0)} MiB", flush=True)
    return rows, compiled, notes, ort.__version__, torch.__version__


def gemm_section(build):
    exe = os.path.join(build, "gemm_bench")
    if not os.access(exe, os.X_OK):
        return ["GEMM kernel benchmark: `gemm_bench` was not built in this run."]
    r = subprocess.run([exe], capture_output=True, text=True)
    return ["```", (r.stdout + r.stderr).strip(), "```"]


def rss_section(rows):
    """The peak-RSS table: per model and batch, the run (1 or 2 threads)
    with the larger peak, for each of kiln and ORT."""
    peak = {}
    for name, b, _, _, _, _, kr, orr in rows:
        k0, o0 = peak.get((name, b), (None, None))
        peak[(name, b)] = (max(k0, kr) if k0 and kr else k0 or kr,
                           max(o0, orr) if o0 and orr else o0 or orr)
    L = ["Peak resident set (VmHWM) of the process that ran the model, the larger of its",
         "1- and 2-thread runs: `kiln bench` and a Python child that loads only numpy and",
         "ONNX Runtime.  \"+model\" is that peak less the process's peak before the model",
         "was loaded (kiln: the CLI with its LLVM libraries; ORT: Python, numpy and",
         "onnxruntime imported): the weights, scratch, input, output and code of the model.",
         "",
         "| model | batch | kiln | ORT | kiln +model | ORT +model | kiln/ORT +model |",
         "|---|---:|---:|---:|---:|---:|---:|"]

    def over(r):
        return None if r is None else r[0] - r[1]

    for (name, b), (k, o) in peak.items():
        L.append(f"| {name} | {b} | {fmt(k and k[0], 0)} | {fmt(o and o[0], 0)} | "
                 f"{fmt(over(k), 0)} | {fmt(over(o), 0)} | {ratio(over(k), over(o))} |")
    return L


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
         "in one run by `bench/run.sh`; ratios below 1 mean kiln is faster.  kiln and ORT",
         f"ran {args.rounds} alternating round(s) of {args.time:g} s per cell, each side's best "
         "median kept; PyTorch one.", "",
         f"- Machine: {machine()}",
         f"- ONNX Runtime {ort_v} (CPU provider, intra-op threads = T, sequential), "
         f"PyTorch {torch_v} (set_num_threads(T), inference mode)",
         f"- Command: `{' '.join(args.command)}`", "",
         "| model | batch | threads | kiln | ORT | PyTorch | kiln/ORT | kiln/PyTorch |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, b, t, k, o, p, _, _ in rows:
        L.append(f"| {name} | {b} | {t} | {fmt(k)} | {fmt(o)} | {fmt(p)} | {ratio(k, o)} | "
                 f"{ratio(k, p)} |")
    L += ["", "## Peak RSS (MiB)", ""] + rss_section(rows)
    L += ["", "## Compile time (`kiln compile`, wall clock)", ""]
    for onnx, dt in compiled.items():
        L.append(f"- {os.path.basename(onnx)}: {fmt(dt, 2)} s")
    L += ["", "## GEMM kernel", ""] + gemm_section(os.path.dirname(args.kiln))
    if notes:
        L += ["", "## Failures", ""] + [f"- {n}" for n in notes]
    if args.out is None:
        print("\n".join(L))
        return
    kept = kept_notes(args.out)
    with open(args.out, "w") as f:
        f.write("\n".join(L) + "\n" + kept)
    print(f"bench.py: wrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", default=None, help="where compiled .so files go")
    ap.add_argument("--out", default=None,
                    help="the Markdown written (default docs/PERFORMANCE.md; with --only, "
                         "stdout)")
    ap.add_argument("--time", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating rounds of kiln and ORT per cell; each side's best median")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None, metavar="NAME[,NAME...]",
                    help=f"just these models ({', '.join(models.SHAPES)})")
    ap.add_argument("--command", nargs="*", default=None)
    args = ap.parse_args()
    args.names = models.selected(sys.argv)
    if args.out is None and args.only is None:
        args.out = "docs/PERFORMANCE.md"
    args.work = args.work or args.models
    args.command = args.command or sys.argv
    write(args, *run(args))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--ort-child":
        sys.exit(ort_child_main(sys.argv[2:]))
    main()
