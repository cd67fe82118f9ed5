"""kiln.quantize and kiln.compile(int8=True): the int8 model runs and agrees
with f32 (cosine, top-1), the report, the file output, errors."""
import numpy as np
import pytest

import kiln
from conftest import mlp_onnx


@pytest.fixture(scope="module")
def trained(digits):
    """A digits MLP trained briefly through TrainStep, as ONNX bytes."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 10))
    x, y = digits["train_x"], digits["train_y"]
    ts = kiln.TrainStep(net, x[:32], optimizer="sgd", lr=0.1, momentum=0.9)
    for e in range(2):
        for i in range(0, len(y), 32):
            ts.step(x[i:i + 32], y[i:i + 32])
    return ts.export()


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_quantized_mlp_agrees_with_f32(digits, trained, tmp_path):
    calib = digits["train_x"][:200]
    q, rep = kiln.quantize(trained, calib, report=True)
    assert isinstance(q, bytes) and len(q) > 0
    assert rep["samples"] == 200 and rep["method"] == "minmax"
    assert any(l["quantized"] for l in rep["layers"])
    f32 = kiln.compile(trained)
    i8 = kiln.compile(q)
    xt, yt = digits["test_x"], digits["test_y"]
    a, b = f32(xt), i8(xt)
    cos, top1 = cosine(a, b), float((a.argmax(1) == b.argmax(1)).mean())
    acc32, acc8 = (float((o.argmax(1) == yt).mean()) for o in (a, b))
    print(f"int8 vs f32: cosine {cos:.5f}, top-1 agreement {top1:.4f}, "
          f"accuracy {acc32:.4f} -> {acc8:.4f}; report: {rep['outputs']}")
    assert cos >= 0.99 and top1 >= 0.95
    assert not np.array_equal(a, b)  # it is another model
    assert rep["outputs"][0]["cosine"] >= 0.99
    # compile(int8=True) quantizes the same way; output= writes the file
    np.testing.assert_array_equal(kiln.compile(trained, int8=True, calib=calib)(xt), b)
    path = kiln.quantize(trained, calib, tmp_path / "q.onnx")
    assert path == str(tmp_path / "q.onnx")
    np.testing.assert_array_equal(kiln.compile(path)(xt), b)
    onnx = pytest.importorskip("onnx")
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def test_quantize_errors(digits):
    data, _ = mlp_onnx()
    with pytest.raises(ValueError, match=r"has 1 input\(s\) \(x\), got data for 2"):
        kiln.quantize(data, [np.zeros((4, 8), np.float32)] * 2)
    with pytest.raises(ValueError, match="no input"):
        kiln.quantize(data, {"y": np.zeros((4, 8), np.float32)})
    with pytest.raises(TypeError, match="float64"):
        kiln.quantize(data, np.zeros((4, 8)))
    with pytest.raises(kiln.KilnError, match="non-finite value") as e:
        kiln.quantize(data, np.full((4, 8), np.nan, np.float32))
    assert e.value.status == "KILN_EINVAL"
    with pytest.raises(ValueError, match="method"):
        kiln.quantize(data, np.zeros((4, 8), np.float32), method="best")
    with pytest.raises(ValueError, match="needs calib"):
        kiln.compile(data, int8=True)
