"""kiln.compile / kiln.Model: results against NumPy and PyTorch, the
signature, zero-copy inputs and preallocated outputs, the cache, errors."""
import os

import numpy as np
import pytest

import kiln
from conftest import mlp_onnx, mlp_ref


def test_onnx_bytes_mlp_matches_numpy_at_any_batch():
    data, w = mlp_onnx()
    m = kiln.compile(data)
    assert [(io.name, io.dtype, io.shape) for io in m.inputs] == [("x", np.float32, ("N", 8))]
    assert [(io.name, io.dtype, io.shape) for io in m.outputs] == \
        [("logits", np.float32, ("N", 4))]
    rng = np.random.RandomState(3)
    for n in (1, 7, 64):
        x = rng.randn(n, 8).astype(np.float32)
        y = m(x)
        assert y.shape == (n, 4) and y.dtype == np.float32
        np.testing.assert_allclose(y, mlp_ref(x, w), rtol=1e-5, atol=1e-5)
    m.close()


def test_inputs_by_name_lists_and_views_and_out():
    data, w = mlp_onnx()
    with kiln.compile(data) as m:
        rng = np.random.RandomState(4)
        big = rng.randn(5, 16).astype(np.float32)
        strided = big[:, ::2]  # not C-contiguous: copied once, same values
        want = mlp_ref(strided, w)
        np.testing.assert_allclose(m(strided), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(m(x=strided), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(m(strided.tolist()), want, rtol=1e-5, atol=1e-5)
        out = np.full((5, 4), np.nan, np.float32)
        got = m(strided, out=out)
        assert got is out  # written in place
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        (t,) = m.run(np.ascontiguousarray(strided))
        np.testing.assert_allclose(t, want, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match=r"out\[0\].*float32\(5, 4\)"):
            m(strided, out=np.zeros((4, 4), np.float32))


def test_threads_give_the_same_result():
    data, w = mlp_onnx(hidden=256, fin=128)
    m = kiln.compile(data)
    x = np.random.RandomState(5).randn(64, 128).astype(np.float32)
    one = m(x)
    m.threads = 2
    assert m.threads == 2
    np.testing.assert_allclose(m(x), one, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(one, mlp_ref(x, w), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="threads"):
        m.threads = 0


def test_resnet18_from_torch_module_matches_pytorch():
    """The issue's acceptance: torchvision ResNet-18 (random init, eval) from
    its nn.Module, batch 1, within 1e-4 of PyTorch."""
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = tv.models.resnet18().eval()
    x = np.random.RandomState(0).rand(1, 3, 224, 224).astype(np.float32)
    m = kiln.compile(net, x)
    assert m.inputs[0].shape == ("N", 3, 224, 224)
    assert m.outputs[0].shape == ("N", 1000)
    assert net.training is False
    y = m(x)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    assert y.shape == (1, 1000)
    err = np.abs(y - want).max()
    print(f"resnet18: max |kiln - torch| = {err:.3g}")
    assert err <= 1e-4, err
    assert np.argmax(y) == np.argmax(want)


def test_torch_module_mode_is_restored_and_inputs_named_after_forward():
    torch = pytest.importorskip("torch")

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, a, b):
            return self.fc(a) * b, a.sum(1, keepdim=True)

    net = Two().train()
    a, b = np.ones((2, 3), np.float32), np.full((2, 1), 2, np.float32)
    m = kiln.compile(net, (a, b))
    assert net.training
    assert [io.name for io in m.inputs] == ["a", "b"]
    assert [io.name for io in m.outputs] == ["output0", "output1"]
    y0, y1 = m(a, b=b)
    with torch.no_grad():
        w0, w1 = net(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_allclose(y0, w0.numpy(), rtol=1e-6)
    np.testing.assert_allclose(y1, w1.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match=r"input 'b' has N = 3 .* input 'a' has N = 2"):
        m(a, np.ones((3, 1), np.float32))


def test_cache_dir_reuses_the_library(tmp_path):
    data, w = mlp_onnx()
    m1 = kiln.compile(data, cache_dir=tmp_path)
    libs = sorted(p for p in os.listdir(tmp_path) if p.endswith(".so"))
    assert len(libs) == 1
    stamp = os.stat(tmp_path / libs[0]).st_mtime_ns
    m2 = kiln.compile(data, cache_dir=tmp_path)
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".so")) == libs
    assert os.stat(tmp_path / libs[0]).st_mtime_ns == stamp  # not compiled again
    x = np.random.RandomState(6).randn(3, 8).astype(np.float32)
    np.testing.assert_array_equal(m1(x), m2(x))
    # another model gets another library; the cached one opens with kiln.load
    other, _ = mlp_onnx(seed=2)
    kiln.compile(other, cache_dir=tmp_path)
    assert len([p for p in os.listdir(tmp_path) if p.endswith(".so")]) == 2
    np.testing.assert_allclose(kiln.load(tmp_path / libs[0])(x), mlp_ref(x, w), rtol=1e-5,
                               atol=1e-5)


# ---- errors ----

def test_corrupt_onnx_is_a_kiln_error_with_message():
    data, _ = mlp_onnx()
    with pytest.raises(kiln.KilnError) as e:
        kiln.compile(data[: len(data) // 2])
    assert e.value.status == "KILN_EPARSE" and e.value.code == 4
    assert "not a valid ONNX model" in e.value.message
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(kiln.KilnError, match="not a valid ONNX model"):
        kiln.compile(b"\x08\x01garbage")


def test_bad_files_are_refused_with_messages(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model file"):
        kiln.compile(tmp_path / "missing.onnx")
    kir = tmp_path / "bad.kir"
    kir.write_text("graph g {\n  x = input f32[N,4]\n  y = nosuchop(x)\n}\n")
    with pytest.raises(kiln.KilnError) as e:
        kiln.compile(kir)
    assert "bad.kir" in e.value.message and e.value.code != 0
    npy = tmp_path / "a.npy"
    np.save(npy, np.zeros(3))
    with pytest.raises(ValueError, match="not a model"):
        kiln.compile(npy)
    with pytest.raises(TypeError, match="a model is a path"):
        kiln.compile(42)


def test_wrong_inputs_are_python_errors_with_messages():
    data, _ = mlp_onnx()
    m = kiln.compile(data)
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(TypeError, match=r"input 'x' has dtype float64, expected float32"):
        m(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"has shape \(2, 7\), expected \(N, 8\) "
                                         r"\(dim 1 must be 8\)"):
        m(np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match=r"rank 2, not 1"):
        m(np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="N must be at least 1"):
        m(np.zeros((0, 8), np.float32))
    with pytest.raises(TypeError, match=r"takes 1 input\(s\) \(x\), got 2"):
        m(x, x)
    with pytest.raises(TypeError, match="missing input"):
        m()
    with pytest.raises(TypeError, match="has no input 'y'"):
        m(y=x)
    with pytest.raises(TypeError, match="given twice"):
        m(x, x=x)
    with pytest.raises(TypeError, match="cannot convert"):
        m([["a"] * 8])
    m.close()
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m(x)
    assert "closed" in repr(m)
