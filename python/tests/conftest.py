"""Shared fixtures of the kiln package's tests.  The package is imported
from this checkout (python/kiln), and libkiln.so from $KILN_LIBRARY (ctest
sets it to the build's) or the package's own search."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="session")
def digits():
    """sklearn's digits, pixels in [0, 1] (f32), labels i64, split 80/20 by
    RandomState(0) as tests/train/make_digits.py splits them."""
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    perm = np.random.RandomState(0).permutation(len(y))
    nt = len(y) // 5
    return dict(train_x=x[perm[nt:]], train_y=y[perm[nt:]], test_x=x[perm[:nt]],
                test_y=y[perm[:nt]])


def mlp_onnx(seed=1, hidden=16, fin=8, fout=4):
    """An ONNX MLP x[N,fin] -> Gemm -> Relu -> Gemm -> logits[N,fout], and its
    weights (w1, b1, w2, b2) for a NumPy reference."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.RandomState(seed)
    w1 = rng.randn(hidden, fin).astype(np.float32)
    b1 = rng.randn(hidden).astype(np.float32)
    w2 = rng.randn(fout, hidden).astype(np.float32)
    b2 = rng.randn(fout).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w1, "fc1.weight"), (b1, "fc1.bias"), (w2, "fc2.weight"), (b2, "fc2.bias"))]
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["logits"], transB=1)]
    g = helper.make_graph(nodes, "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", fin])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                         ["N", fout])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString(), (w1, b1, w2, b2)


def mlp_ref(x, w):
    w1, b1, w2, b2 = (a.astype(np.float64) for a in w)
    return np.maximum(x.astype(np.float64) @ w1.T + b1, 0) @ w2.T + b2
