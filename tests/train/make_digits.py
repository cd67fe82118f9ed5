#!/usr/bin/python3
"""make_digits.py: the digits data set and two untrained reference models for
`kiln train`'s acceptance runs, written into OUTDIR.

Data: sklearn.datasets.load_digits (shipped by Debian's python3-sklearn, no
download), pixels scaled to [0, 1] as float32, labels int64, split 80/20 by a
permutation from numpy's RandomState(0), so every run gets the same split:
  train_x.npy f32[1438,64]   train_img.npy f32[1438,1,8,8]   train_y.npy i64[1438]
  test_x.npy  f32[359,64]    test_img.npy  f32[359,1,8,8]    test_y.npy  i64[359]

Models, eval-mode ONNX (opset 17) written with onnx.helper, no PyTorch,
parameters under torch.nn's state_dict names and initialised as torch.nn
initialises Linear/Conv2d (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and
bias) from RandomState(SEED), with a symbolic batch dim "N":
  mlp.onnx: x[N,64] -> Linear(64,64) -> ReLU -> Linear(64,10) -> logits
  cnn.onnx: x[N,1,8,8] -> Conv2d(1,8,3,pad 1) -> BatchNorm2d(8) -> ReLU
            -> MaxPool2d(2) -> Flatten -> Linear(128,10) -> logits
`kiln train` derives the train-mode graph (batch statistics) itself.

usage: /usr/bin/python3 make_digits.py OUTDIR [SEED]
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits


def write_data(out):
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    perm = np.random.RandomState(0).permutation(len(y))
    ntest = len(y) // 5
    parts = {"test": perm[:ntest], "train": perm[ntest:]}
    for name, idx in parts.items():
        np.save(os.path.join(out, name + "_x.npy"), np.ascontiguousarray(x[idx]))
        np.save(os.path.join(out, name + "_img.npy"),
                np.ascontiguousarray(x[idx].reshape(-1, 1, 8, 8)))
        np.save(os.path.join(out, name + "_y.npy"), np.ascontiguousarray(y[idx]))


def uniform(rng, shape, fan_in):
    b = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-b, b, size=shape).astype(np.float32)


def init(name, a):
    return numpy_helper.from_array(np.ascontiguousarray(a), name)


def linear(rng, name, fin, fout, x, y):
    inits = [init(name + ".weight", uniform(rng, (fout, fin), fin)),
             init(name + ".bias", uniform(rng, (fout,), fin))]
    node = helper.make_node("Gemm", [x, name + ".weight", name + ".bias"], [y],
                            name=name, transB=1)
    return inits, [node]


def save(out, name, nodes, inits, xshape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"] + xshape)
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])
    g = helper.make_graph(nodes, name, [x], [y], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                          producer_name="make_digits.py")
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, os.path.join(out, name + ".onnx"))


def mlp(out, rng):
    i1, n1 = linear(rng, "fc1", 64, 64, "x", "h1")
    relu = helper.make_node("Relu", ["h1"], ["h2"], name="relu1")
    i2, n2 = linear(rng, "fc2", 64, 10, "h2", "logits")
    save(out, "mlp", n1 + [relu] + n2, i1 + i2, [64])


def cnn(out, rng):
    c = 8
    inits = [init("conv1.weight", uniform(rng, (c, 1, 3, 3), 9)),
             init("conv1.bias", uniform(rng, (c,), 9)),
             init("bn1.weight", np.ones(c, np.float32)),
             init("bn1.bias", np.zeros(c, np.float32)),
             init("bn1.running_mean", np.zeros(c, np.float32)),
             init("bn1.running_var", np.ones(c, np.float32))]
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], name="conv1",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        # ONNX momentum 0.9 is PyTorch's momentum 0.1
        helper.make_node("BatchNormalization", ["c1", "bn1.weight", "bn1.bias",
                         "bn1.running_mean", "bn1.running_var"], ["b1"], name="bn1",
                         epsilon=1e-5, momentum=0.9),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Flatten", ["p1"], ["f1"], name="flatten", axis=1),
    ]
    i2, n2 = linear(rng, "fc", c * 16, 10, "f1", "logits")
    save(out, "cnn", nodes + n2, inits + i2, [1, 8, 8])


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) == 3 else 1
    os.makedirs(out, exist_ok=True)
    write_data(out)
    mlp(out, np.random.RandomState(seed))
    cnn(out, np.random.RandomState(seed + 1))


if __name__ == "__main__":
    main()
