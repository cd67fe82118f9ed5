#!/usr/bin/env python3
"""kiln vs ONNX Runtime on QDQ models written by ORT's own quantizer.

    .venv/bin/python tests/onnx/check_qdq.py KILN OUT_DIR [NAME...]

For each model (default: resnet18 and mobilenet_v2 from bench/models.py,
with check_bench_models.py's input-sensitive weights) this exports the f32
model, quantizes it with onnxruntime.quantization.quantize_static (QDQ
format, u8 activations, per-channel s8 weights, min-max calibration on 8
random images), then

- imports the QDQ model into kiln, compiles it with `KILN compile` and runs
  the library with `KILN run` (batch 2, two threads), and runs ORT on the
  same QDQ model and input;
- reports the largest difference from ORT's outputs in units of the output's
  quantization step (the scale of the last DequantizeLinear), against ORT's
  int8 run and against ORT running the Q/DQ nodes as written (optimisations
  off), and fails when kiln and ORT's int8 run disagree (see MAX_MEAN_STEPS;
  on a CPU without VNNI, where ORT's u8s8 kernels saturate, kiln is held to
  the run as written instead: ort_int8.py).  Both run the model on integer kernels (kiln's qfuse pass
  makes QLinearConv/QLinearMatMul of the Q/DQ patterns; depthwise convs
  stay f32 between their Q/DQ nodes), so the two differ by rounding at the
  requantization points only.

The same runs for ORT's QOperator format (QLinearConv with the
com.microsoft QLinearAdd, QLinearGlobalAveragePool and QGemm, which kiln
imports as standard ops between DQ and Q).  Then the same f32 model goes
through `kiln quantize` (min-max on 8
random images of the input's distribution): ORT runs kiln's QDQ file, and
kiln's compiled int8 library must agree with it (cosine, top-1).

The report lines are what docs/QUANTIZATION.md quotes.  Runs with the venv
of scripts/setup-venv.sh, the quantizer in its .venv-quant; exits 77 when onnxruntime or torch is missing, 1
when a model fails, 0 otherwise.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import check_bench_models as cbm  # noqa: E402
import models  # noqa: E402
import ort_int8  # noqa: E402

DEFAULT = ("resnet18", "mobilenet_v2")
# A rounding that flips one step at an early requantization point moves
# the later layers' inputs, so in a deep net the largest difference grows
# with depth even between two correct runs: kiln's own interpreter (f64
# sums) and its library (f32) differ by up to 5 output steps on
# MobileNetV2, 1.3 on average.  So the bounds are on agreement, not on the
# worst element: the mean difference in steps, the cosine between kiln's
# and ORT's outputs, and the same top-1 class for every image (or one the
# reference scores within an output step of its top-1: random images
# can tie two classes).  A wrong layer fails all three by far.
MAX_MEAN_STEPS = 3.0
MIN_COSINE = 0.99
CALIB = 8


QUANT_PY = os.path.join(HERE, "..", "..", ".venv-quant", "bin", "python")


def quantize(src, dst, shape, fmt="qdq"):
    """tests/onnx/ort_quantize.py in scripts/setup-venv.sh's .venv-quant."""
    cbm.run([QUANT_PY, os.path.join(HERE, "ort_quantize.py"), src, dst, "input",
             ",".join(str(d) for d in shape), str(CALIB), fmt])


def output_step(onnx_mod, path):
    """The scale of the DequantizeLinear that makes the graph's output, or of
    the last one before it."""
    from onnx import numpy_helper
    m = onnx_mod.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    last = None
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[1] in inits:
            last = float(inits[n.input[1]].reshape(-1)[0])
    return last


def check(np, ort, torch, kiln, out, name):
    f32 = os.path.join(out, f"{name}.onnx")
    cbm.export(torch, name, f32)
    for fmt in ("qdq", "qoperator"):
        err = check_format(np, ort, kiln, out, name, f32, fmt)
        if err:
            return f"{fmt}: {err}"
    x = np.load(os.path.join(out, f"{name}_qdq_input.npy"))
    ref = ort.InferenceSession(f32, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    return check_kiln_quantizer(np, ort, kiln, out, name, f32, x, ref)


def check_format(np, ort, kiln, out, name, f32, fmt):
    import onnx as onnx_mod
    qdq = os.path.join(out, f"{name}.{fmt}.onnx")
    so = os.path.join(out, f"{name}.{fmt}.so")
    shape, _ = models.SHAPES[name]
    quantize(f32, qdq, shape, fmt)
    cbm.run([kiln, "compile", qdq, "-o", so])
    x = np.random.default_rng(7).standard_normal((2, *shape), dtype=np.float32)
    xin = os.path.join(out, f"{name}_qdq_input.npy")
    res = os.path.join(out, f"{name}_{fmt}")
    np.save(xin, x)
    cbm.run([kiln, "run", so, "-i", f"input={xin}", "-o", res],
            dict(os.environ, KILN_NUM_THREADS="2"))
    got = np.load(os.path.join(res, "output.npy"))
    # Without VNNI, ORT's QLinearConv saturates even with optimisations off:
    # the QOperator model is held to the QDQ file's run as written, the same
    # quantize_static calibration on the same images, so the same scales.
    exact = ort_int8.exact_u8s8() or fmt == "qdq"
    sess, what_ref = ort_int8.reference_session(
        ort, qdq if exact else os.path.join(out, f"{name}.qdq.onnx"))
    if not exact:
        what_ref += ", of the QDQ file"
    want = sess.run(None, {"input": x})[0]
    ort8 = ort.InferenceSession(qdq, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    so_lit = ort.SessionOptions()
    so_lit.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    literal = ort.InferenceSession(qdq, so_lit, providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    ref = ort.InferenceSession(f32, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    if got.shape != want.shape:
        return f"shape {got.shape}, ORT {want.shape}"
    step = output_step(onnx_mod, qdq)
    lit = float(np.abs(got.astype(np.float64) - literal).max()) / step
    o8 = float(np.abs(got.astype(np.float64) - ort8).max()) / step
    d = np.abs(got.astype(np.float64) - want) / step
    within1 = float((d <= 1.0001).mean())
    mean = float(d.mean())
    g64, w64 = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    agree = float(g64 @ w64 / np.sqrt((g64 @ g64) * (w64 @ w64)))
    top1 = top1_agreement(np, got, want, step)
    cos = float((got * ref).sum() / np.sqrt((got * got).sum() * (ref * ref).sum()))
    what = "QDQ" if fmt == "qdq" else "QOperator (QLinearConv, com.microsoft QLinearAdd, QGemm...)"
    print(f"{name}: {what} (ORT quantize_static, per-channel s8 weights, u8 activations): "
          f"kiln vs ORT int8 max |diff| {o8:.2f} output steps (step {step:.4g}), "
          f"vs ORT running the Q/DQ nodes as written {lit:.2f}; against {what_ref}: "
          f"{100 * within1:.1f}% of outputs within 1 step, mean {mean:.2f} steps, cosine "
          f"{agree:.5f}, top-1 agreement {top1:.2f}; logit cosine vs f32 {cos:.4f}")
    if not mean <= MAX_MEAN_STEPS:
        return f"on average {mean:.2f} output steps from {what_ref} (at most {MAX_MEAN_STEPS})"
    if not agree >= MIN_COSINE:
        return f"cosine {agree:.5f} with {what_ref} (at least {MIN_COSINE})"
    if top1 < 1:
        return f"top-1 class differs from {what_ref} on {100 * (1 - top1):.0f}% of the images"
    return None


def top1_agreement(np, got, want, tol):
    """The share of rows whose top-1 class is the reference's, or, where it
    is not, one the reference scores within tol (an output step) of its
    own top-1: a random image can tie two classes to within rounding."""
    rows = np.arange(len(want))
    g, w = got.argmax(1), want.argmax(1)
    return float(((g == w) | (want[rows, w] - want[rows, g] <= tol)).mean())


def cosine(np, a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def check_kiln_quantizer(np, ort, kiln, out, name, f32, x, ref):
    """`kiln quantize` on the same f32 model (min-max on CALIB images of
    x's distribution), then kiln's compiled int8 library and ORT on that
    QDQ file against each other and against f32."""
    shape = x.shape[1:]
    calib = os.path.join(out, f"{name}_calib.npy")
    np.save(calib, np.random.default_rng(1).standard_normal((CALIB, *shape), dtype=np.float32))
    kq = os.path.join(out, f"{name}.kq.onnx")
    so = os.path.join(out, f"{name}.kq.so")
    cbm.run([kiln, "quantize", f32, "--calib", calib, "-o", kq, "--quiet"])
    cbm.run([kiln, "compile", kq, "-o", so])
    res = os.path.join(out, f"{name}_kq")
    xin = os.path.join(out, f"{name}_qdq_input.npy")
    cbm.run([kiln, "run", so, "-i", f"input={xin}", "-o", res],
            dict(os.environ, KILN_NUM_THREADS="2"))
    got = np.load(os.path.join(res, "output.npy"))
    sess, what_ref = ort_int8.reference_session(ort, kq)
    want = sess.run(None, {"input": x})[0]
    # kiln's file ends in an f32 Gemm: a tie is within the runs' mean difference
    tie = float(np.abs(got.astype(np.float64) - want).mean())
    agree, top1 = cosine(np, got, want), top1_agreement(np, got, want, tie)
    print(f"{name}: kiln quantize (min-max on {CALIB} images): kiln int8 vs {what_ref} on the same "
          f"file cosine {agree:.5f}, top-1 agreement {top1:.2f}; vs f32: kiln cosine "
          f"{cosine(np, got, ref):.4f}, top-1 {float((got.argmax(1) == ref.argmax(1)).mean()):.2f}; "
          f"ORT cosine {cosine(np, want, ref):.4f}")
    if not agree >= MIN_COSINE:
        return f"kiln quantize's model: cosine {agree:.5f} between kiln and ORT (at least {MIN_COSINE})"
    if top1 < 1:
        return "kiln quantize's model: kiln's and ORT's top-1 classes differ"
    return None


def ready():
    if not os.access(QUANT_PY, os.X_OK):
        return "no .venv-quant with ONNX Runtime's quantizer (scripts/setup-venv.sh)"
    return None


if __name__ == "__main__":
    sys.exit(cbm.check_models(sys.argv, __doc__, DEFAULT, check, ready))
