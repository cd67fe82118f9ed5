#!/usr/bin/env python3
"""Checks ONNX models that kiln exported: the checker, then ONNX Runtime.

For each model M.onnx given (or found in a folder given), runs
onnx.checker.check_model(full_check=True) on it, then runs it in ONNX
Runtime on M.in0.npy, M.in1.npy, ... (graph inputs in order) and compares
every output with M.out0.npy, M.out1.npy, ... (kiln's interpreter wrote
them): floats within atol + rtol * |expected| (1e-4 each, --tol), integers
and bools exactly.  A model without .npy files is only checked.

    .venv/bin/python tests/onnx/check_export.py [--tol T] DIR_OR_MODEL...

Run it with the venv of scripts/setup-venv.sh, which adds onnxruntime to
Debian's onnx and numpy.  Exits 77 (ctest's skip code) with "skipped: no
onnxruntime" when onnxruntime cannot be imported, 1 when any model fails or
none is found, 0 otherwise.
"""
import glob
import os
import sys


def models_in(args):
    out = []
    for a in args:
        if os.path.isdir(a):
            out += sorted(glob.glob(os.path.join(a, "*.onnx")))
        else:
            out.append(a)
    return out


def npys(model, kind):
    base = model[:-len(".onnx")]
    files = []
    while os.path.exists(f"{base}.{kind}{len(files)}.npy"):
        files.append(f"{base}.{kind}{len(files)}.npy")
    return files


def compare(np, name, got, want, tol):
    if got.shape != want.shape:
        return f"output {name}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "fc":
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        bound = tol + tol * np.abs(want.astype(np.float64))
        bad = ~(err <= bound) & ~(np.isnan(got) & np.isnan(want))
        if bad.any():
            return (f"output {name}: {int(bad.sum())} of {want.size} elements differ, "
                    f"max abs error {float(np.nanmax(err)):.3g}")
        return None
    if not np.array_equal(got, want):
        return f"output {name}: values differ from kiln's"
    return None


def check(onnx, ort, np, model, tol):
    m = onnx.load(model)
    onnx.checker.check_model(m, full_check=True)
    ins, outs = npys(model, "in"), npys(model, "out")
    if not outs:
        return "checked (no .npy: not run)", None
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(ins):
        return None, f"{len(names)} graph inputs but {len(ins)} .in*.npy files"
    feeds = {n: np.load(f) for n, f in zip(names, ins)}
    got = sess.run(None, feeds)
    if len(got) != len(outs):
        return None, f"{len(got)} outputs but {len(outs)} .out*.npy files"
    for o, g, f in zip(sess.get_outputs(), got, outs):
        why = compare(np, o.name, np.asarray(g), np.load(f), tol)
        if why:
            return None, why
    return f"checked, {len(got)} outputs match", None


def main(argv):
    tol = 1e-4
    if len(argv) > 2 and argv[1] == "--tol":
        tol = float(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        print(f"skipped: no onnxruntime ({e}); run scripts/setup-venv.sh and use .venv/bin/python")
        return 77
    ort.set_default_logger_severity(3)
    models = models_in(argv[1:])
    if not models:
        print("FAIL: no .onnx models found in " + " ".join(argv[1:]))
        return 1
    failed = 0
    for model in models:
        try:
            ok, why = check(onnx, ort, np, model, tol)
        except Exception as e:  # checker and runtime errors alike
            ok, why = None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
        print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(model)}: {ok or why}")
        failed += not ok
    print(f"{len(models) - failed} of {len(models)} exported models pass "
          f"(onnx {onnx.__version__}, onnxruntime {ort.__version__})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
