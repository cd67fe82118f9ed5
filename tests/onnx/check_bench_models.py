#!/usr/bin/env python3
"""kiln vs ONNX Runtime on bench/models.py's SqueezeNet 1.1 and ShuffleNetV2.

    .venv/bin/python tests/onnx/check_bench_models.py KILN OUT_DIR [NAME...]

For each model (default: squeezenet1_1 and shufflenet_v2_x1_0) this builds
the module bench/models.py benchmarks, exports it to OUT_DIR/NAME.onnx
(3x224x224, batch axis "N", as bench/models.py does), compiles it with
`KILN compile`, runs the library with `KILN run` at batch 1 (one thread)
and batch 3 (KILN_NUM_THREADS=2), and compares each output with ONNX
Runtime's on the same input: within 1e-4 + 1e-4 * |ORT| everywhere.

The weights are bench/models.py's random ones, rescaled so that the output
depends on the input (with torchvision's own init the logits of these two
nets barely move with it, and any body would pass): every conv gets He
init, and BatchNorm statistics are those of a random batch (as if
trained).  The batch of 3 must then differ between its images by more than
100 times the tolerance, so a wrong feature map would show.

Runs with the venv of scripts/setup-venv.sh (onnxruntime, with Debian's
torch and onnx through system site packages).  Exits 77 (ctest's skip code)
when onnxruntime or torch is missing, 1 when a model fails, 0 otherwise.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import models  # noqa: E402

TOL = 1e-4
DEFAULT = ("squeezenet1_1", "shufflenet_v2_x1_0")


def conditioned(torch, name):
    """bench/models.py's module for name, with input-sensitive weights."""
    m = models.build(torch, name)
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, torch.nn.Conv2d):
            fan_in = mod.weight[0].numel()
            with torch.no_grad():
                mod.weight.normal_(0, (2.0 / fan_in) ** 0.5, generator=g)
                if mod.bias is not None:
                    mod.bias.uniform_(-0.1, 0.1, generator=g)
        elif isinstance(mod, torch.nn.BatchNorm2d):
            mod.reset_running_stats()
            mod.momentum = None  # a cumulative average: one batch's statistics
    m.train()
    with torch.no_grad():
        m(torch.randn(4, *models.SHAPES[name][0], generator=g))
    return m.eval()


def export(torch, name, path):
    shape, opset = models.SHAPES[name]
    torch.onnx.export(conditioned(torch, name), (torch.randn(2, *shape),), path,
                      opset_version=opset, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
                      do_constant_folding=True)


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r.stdout


def check(np, ort, torch, kiln, out, name):
    onnx = os.path.join(out, f"{name}.onnx")
    so = os.path.join(out, f"{name}.so")
    export(torch, name, onnx)
    run([kiln, "compile", onnx, "-o", so])
    sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    shape, _ = models.SHAPES[name]
    for batch, threads in ((1, 1), (3, 2)):
        x = np.random.default_rng(batch).standard_normal((batch, *shape), dtype=np.float32)
        xin = os.path.join(out, f"{name}_b{batch}_input.npy")
        res = os.path.join(out, f"{name}_b{batch}")
        np.save(xin, x)
        env = dict(os.environ, KILN_NUM_THREADS=str(threads))
        run([kiln, "run", so, "-i", f"input={xin}", "-o", res], env)
        got = np.load(os.path.join(res, "output.npy"))
        want = sess.run(None, {"input": x})[0]
        if got.shape != want.shape:
            return f"batch {batch}: shape {got.shape}, ORT {want.shape}"
        err = np.abs(got.astype(np.float64) - want)
        bad = ~(err <= TOL + TOL * np.abs(want))
        if bad.any():
            return (f"batch {batch}, {threads} threads: {int(bad.sum())} of {want.size} "
                    f"outputs differ from ORT's, max abs error {float(err.max()):.3g}")
        spread = float(np.abs(want - want[0]).max())
        if batch > 1 and spread < 100 * TOL:
            return f"batch {batch}: the images' outputs differ by only {spread:.3g}"
        print(f"{name}: batch {batch}, {threads} threads: max abs error "
              f"{float(err.max()):.3g} (outputs up to {float(np.abs(want).max()):.3g}"
              + (f", spread between images {spread:.3g})" if batch > 1 else ")"))
    return None


def check_models(argv, doc, default, check, ready=None):
    """The command line this script and check_qdq.py share: KILN OUT_DIR
    [NAME...] (default: default), check(np, ort, torch, kiln, out, name)
    per model, which returns why it failed or None.  Exits 77 when numpy,
    onnxruntime, torch or torchvision is missing or ready() returns why
    not, 2 on a bad command line, 1 when a model fails, 0 otherwise."""
    if len(argv) < 3:
        sys.stderr.write(doc)
        return 2
    kiln, out, names = argv[1], argv[2], argv[3:] or default
    try:
        import numpy as np
        import onnxruntime as ort
        import torch
        import torchvision  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (run with .venv/bin/python: scripts/setup-venv.sh)")
        return 77
    why = ready() if ready else None
    if why:
        print(f"skipped: {why}")
        return 77
    torch.set_num_threads(2)
    os.makedirs(out, exist_ok=True)
    failed = 0
    for name in names:
        try:
            why = check(np, ort, torch, kiln, out, name)
        except RuntimeError as e:
            why = str(e)
        if why:
            print(f"{name}: FAIL: {why}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(check_models(sys.argv, __doc__, DEFAULT, check))
