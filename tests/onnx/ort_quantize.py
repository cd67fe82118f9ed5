#!/usr/bin/env python3
"""ONNX Runtime's static quantizer, as a user runs it: SRC.onnx -> DST.onnx.

    .venv-quant/bin/python tests/onnx/ort_quantize.py SRC DST INPUT C,H,W [N [FORMAT]]

QDQ format (FORMAT qoperator: ORT's QOperator format, QLinearConv and the
com.microsoft QLinearAdd, QGemm...), u8 activations, per-channel s8 weights, min-max calibration on
N (default 8) standard-normal images of shape 1xCxHxW fed to input INPUT
(seed 42).  Run with scripts/setup-venv.sh's .venv-quant: the quantizer
needs a newer onnx than Debian's, so it lives apart from torch.
"""
import sys

import numpy as np
import onnxruntime.quantization as q


def main(argv):
    src, dst, name, shape = argv[1], argv[2], argv[3], tuple(int(d) for d in argv[4].split(","))
    count = int(argv[5]) if len(argv) > 5 else 8
    fmt = q.QuantFormat.QOperator if len(argv) > 6 and argv[6] == "qoperator" else q.QuantFormat.QDQ
    rng = np.random.default_rng(42)
    batches = iter([{name: rng.standard_normal((1, *shape), dtype=np.float32)}
                    for _ in range(count)])

    class Reader(q.CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    q.quantize_static(src, dst, Reader(), quant_format=fmt, per_channel=True,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
