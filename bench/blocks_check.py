#!/usr/bin/env python3
"""Max abs difference of kiln-compiled blocks (NAME.so, run through
`kiln run`) from ONNX Runtime on the same random input.

    /work/main/.venv/bin/python bench/blocks_check.py KILN DIR NAME...
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort


def main():
    kiln, d, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    worst = 0.0
    for n in names:
        s = ort.InferenceSession(f"{d}/{n}.onnx", providers=["CPUExecutionProvider"])
        i = s.get_inputs()[0]
        x = np.random.default_rng(1).standard_normal(i.shape).astype(np.float32)
        ref = s.run(None, {i.name: x})[0]
        with tempfile.TemporaryDirectory() as t:
            np.save(f"{t}/x.npy", x)
            subprocess.run([kiln, "run", f"{d}/{n}.so", "-i", f"{i.name}=x.npy", "-o", t],
                           cwd=t, check=True, capture_output=True)
            y = np.load(f"{t}/{s.get_outputs()[0].name}.npy")
        err = float(np.abs(y - ref).max())
        worst = max(worst, err)
        print(f"{n}: max |kiln - ORT| = {err:.3g} (|ORT| max {np.abs(ref).max():.3g})")
    sys.exit(0 if worst < 1e-3 else 1)


if __name__ == "__main__":
    main()
