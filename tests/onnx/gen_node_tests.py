#!/usr/bin/python3
"""Generates the ONNX backend node test cases into a folder.

Debian's python3-onnx ships the generator but not the generated data, so the
conformance runner's input is made here: onnx.backend.test.cmd_tools
generate-data writes DIR/node/<case>/model.onnx plus test_data_set_*/
{input,output}_*.pb TensorProto files (and DIR/simple, DIR/pytorch-*).

onnx 1.12's case generators still use numpy aliases that numpy 1.24 removed
(np.float, np.int, np.bool, np.object, ...), so they are restored before the
generator is imported.  Run with Debian's /usr/bin/python3 (the one that has
onnx and numpy).

    /usr/bin/python3 tests/onnx/gen_node_tests.py OUT_DIR [STAMP_FILE]

The optional stamp file is written last, so a build system can skip the
(slow) generation when it exists.

Gelu is in kiln's op table but entered ONNX only at opset 20, after onnx
1.12, whose suite therefore has no Gelu case.  add_gelu_cases writes two,
named test_kiln_gelu_*, in the suite's own layout, from the opset-20
definition (0.5*x*(1+erf(x/sqrt(2))), and the tanh form), computed here in
float64 and stored as float32.
"""
import os
import sys
import warnings

import numpy as np

for alias, real in (("float", float), ("int", int), ("bool", bool),
                    ("object", object), ("str", str), ("complex", complex),
                    ("long", int), ("unicode", str)):
    if alias not in np.__dict__:
        setattr(np, alias, real)

warnings.filterwarnings("ignore")


def add_gelu_cases(node_dir):
    import math
    from onnx import helper, numpy_helper, TensorProto

    rng = np.random.RandomState(20)
    x = rng.randn(3, 4, 5).astype(np.float32)
    xd = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    cases = {
        "none": 0.5 * xd * (1 + erf(xd / math.sqrt(2))),
        "tanh": 0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi)
                                        * (xd + 0.044715 * xd ** 3))),
    }
    for approx, y in cases.items():
        name = f"test_kiln_gelu_{approx}"
        attrs = {} if approx == "none" else {"approximate": "tanh"}
        node = helper.make_node("Gelu", ["x"], ["y"], **attrs)
        graph = helper.make_graph(
            [node], name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        d = os.path.join(node_dir, name, "test_data_set_0")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(node_dir, name, "model.onnx"), "wb") as f:
            f.write(model.SerializeToString())
        for fname, arr in (("input_0.pb", x), ("output_0.pb", y.astype(np.float32))):
            with open(os.path.join(d, fname), "wb") as f:
                f.write(numpy_helper.from_array(arr).SerializeToString())


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    out = argv[1]
    from onnx.backend.test import cmd_tools  # after the aliases exist
    os.makedirs(out, exist_ok=True)
    sys.argv = ["cmd_tools", "generate-data", "-o", out]
    cmd_tools.main()
    add_gelu_cases(os.path.join(out, "node"))
    n = len(os.listdir(os.path.join(out, "node")))
    print(f"generated {n} node test cases into {out}/node")
    if len(argv) > 2:
        with open(argv[2], "w") as f:
            f.write(f"{n}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
