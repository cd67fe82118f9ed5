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


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    out = argv[1]
    from onnx.backend.test import cmd_tools  # after the aliases exist
    os.makedirs(out, exist_ok=True)
    sys.argv = ["cmd_tools", "generate-data", "-o", out]
    cmd_tools.main()
    n = len(os.listdir(os.path.join(out, "node")))
    print(f"generated {n} node test cases into {out}/node")
    if len(argv) > 2:
        with open(argv[2], "w") as f:
            f.write(f"{n}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
