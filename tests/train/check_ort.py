#!/usr/bin/env python3
"""check_ort.py: ONNX Runtime's predictions from a model exported by
`kiln train --export` against kiln's own (`--val-out`) on the same inputs.

Checks onnx.checker (full_check) on the file, that ORT's argmax equals
kiln's for every row, that the logits agree within 1e-4 (absolute) and,
given the targets, prints both accuracies.  With --int8 (a QDQ model
written by `kiln quantize`, kiln's logits from its compiled 8-bit library):
ORT's int8 kernels round their own way, so the logits need only agree
within 0.25 and the argmax on 99% of the rows; on a CPU without VNNI,
where ORT's u8s8 kernels saturate, the reference is ORT running the Q/DQ
nodes as written (tests/onnx/ort_int8.py).  Run it with the repo's .venv/bin/python (made by
scripts/setup-venv.sh), which has onnxruntime; without onnxruntime it exits
77 (skip) and says why.

usage: check_ort.py [--int8] MODEL.onnx X.npy KILN_OUT.npy [Y.npy]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "onnx"))
import ort_int8  # noqa: E402


def main():
    int8 = len(sys.argv) > 1 and sys.argv[1] == "--int8"
    if int8:
        del sys.argv[1]
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        print(f"skipped: {e} (run scripts/setup-venv.sh; use .venv/bin/python)")
        return 77
    path, xpath, kpath = sys.argv[1:4]
    onnx.checker.check_model(onnx.load(path), full_check=True)
    x, want = np.load(xpath), np.load(kpath)
    if int8:
        sess, what = ort_int8.reference_session(ort, path)
        if what != "ORT int8":
            print(f"reference: {what}")
    else:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    if got.shape != want.shape:
        print(f"FAIL: ORT output {got.shape}, kiln's {want.shape}")
        return 1
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    tol = 0.25 if int8 else 1e-4
    same = got.argmax(axis=1) == want.argmax(axis=1)
    print(f"{path}: {len(x)} rows, max |ORT - kiln| = {diff:.3g} (tolerance {tol:.3g}), "
          f"argmax equal on {int(same.sum())}/{len(same)}")
    if len(sys.argv) == 5:
        y = np.load(sys.argv[4])
        print(f"accuracy: ORT {100 * np.mean(got.argmax(axis=1) == y):.2f}%, "
              f"kiln {100 * np.mean(want.argmax(axis=1) == y):.2f}%")
    if not (same.mean() >= 0.99 if int8 else same.all()) or not diff <= tol:
        print("FAIL: ONNX Runtime and kiln disagree")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
