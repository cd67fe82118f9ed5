"""Errors, dtypes and NumPy <-> kiln_tensor views shared by the package."""
import ctypes
import os

import numpy as np

from . import _lib as L


class KilnError(RuntimeError):
    """An error reported by libkiln: ``code`` is the kiln_status number,
    ``status`` its name ("KILN_EINVAL"), ``message`` kiln's own message."""

    def __init__(self, message, code=L.EINVAL):
        self.code = int(code)
        self.status = L.STATUS_NAMES[code] if 0 <= code < len(L.STATUS_NAMES) else str(code)
        self.message = message
        super().__init__(f"{message} [{self.status}]")


def new_error():
    return L.Error()


def check(status, err, what=None):
    """Raises KilnError for a failed call; err is the kiln_error it filled."""
    if status == L.OK:
        return
    msg = err.msg.decode("utf-8", "replace") if err is not None else ""
    if not msg:
        name = L.lib.kiln_status_str(status)
        msg = (name.decode() if name else f"status {status}")
    if what:
        msg = f"{what}: {msg}"
    raise KilnError(msg, status)


_TO_NUMPY = {
    L.F32: np.dtype(np.float32), L.F64: np.dtype(np.float64), L.F16: np.dtype(np.float16),
    L.BF16: np.dtype(np.uint16),  # bfloat16 bit patterns: NumPy has no bfloat16
    L.I8: np.dtype(np.int8), L.U8: np.dtype(np.uint8), L.I32: np.dtype(np.int32),
    L.I64: np.dtype(np.int64), L.BOOL: np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items() if k != L.BF16}


def np_dtype(kdt):
    try:
        return _TO_NUMPY[kdt]
    except KeyError:
        raise KilnError(f"kiln dtype {kdt} has no NumPy equivalent", L.EUNSUPPORTED) from None


def kiln_dtype(dt):
    """kiln's dtype for a NumPy dtype; TypeError when kiln has none."""
    dt = np.dtype(dt)
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise TypeError(f"kiln has no dtype for NumPy's {dt} (it takes float32, float64, "
                        "float16, int8, uint8, int32, int64 and bool)") from None


def fspath(p):
    return os.fsencode(os.fspath(p))


def as_array(x, dtype, what):
    """x as a C-contiguous, aligned NumPy array of dtype, without a copy when
    it already is one.  A NumPy array of another dtype is a TypeError (kiln
    never casts behind the caller's back); other objects (lists, scalars,
    CPU torch tensors) are converted to dtype."""
    if isinstance(x, np.ndarray):
        if x.dtype != dtype:
            raise TypeError(f"{what} has dtype {x.dtype}, expected {dtype} "
                            f"(convert it with .astype(np.{dtype.name}))")
    else:
        if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch.Tensor
            x = x.detach().cpu().numpy()
            if x.dtype != dtype:
                raise TypeError(f"{what} has dtype {x.dtype}, expected {dtype}")
        try:
            x = np.asarray(x, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{what}: cannot convert {type(x).__name__} to a {dtype} array: "
                            f"{e}") from None
    if x.ndim > L.MAX_RANK:
        raise ValueError(f"{what} has rank {x.ndim}; kiln takes at most {L.MAX_RANK}")
    return contiguous(x)


def contiguous(a):
    """a itself when it is C-contiguous and aligned, else a C-ordered copy
    (the one copy: kiln reads dense row-major memory).  Unlike
    np.ascontiguousarray it keeps a 0-d array 0-d."""
    if a.flags.c_contiguous and a.flags.aligned:
        return a
    return np.array(a, order="C")


def view(a):
    """A kiln_tensor describing NumPy array a's memory (no copy).  The caller
    keeps a alive while the view is used."""
    t = L.Tensor()
    t.dtype = kiln_dtype(a.dtype)
    t.rank = a.ndim
    for i, d in enumerate(a.shape):
        t.shape[i] = d
    # an empty array may have no buffer, and kiln wants a pointer
    t.data = a.ctypes.data or ctypes.addressof(_EMPTY)
    return t


_EMPTY = ctypes.create_string_buffer(64)


def to_numpy(t):
    """A copy of kiln_tensor t (a ctypes Tensor) as a NumPy array."""
    dt = np_dtype(t.dtype)
    shape = tuple(t.shape[i] for i in range(t.rank))
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if n == 0:
        return np.zeros(shape, dt)
    buf = (ctypes.c_char * (n * dt.itemsize)).from_address(t.data)
    return np.frombuffer(buf, dtype=dt).reshape(shape).copy()


def tensor_set_to_dict(s):
    """A copy of a kiln_tensor_set as {name: ndarray}, in the set's order."""
    out = {}
    for i in range(s.contents.count):
        item = s.contents.items[i]
        out[item.name.decode()] = to_numpy(item.tensor.contents)
    return out


def dict_to_tensor_set(d, what="state"):
    """A new kiln_tensor_set (caller frees) holding copies of d's arrays."""
    s = L.lib.kiln_tensor_set_new()
    if not s:
        raise KilnError("out of memory", L.ENOMEM)
    try:
        for name, v in d.items():
            if not isinstance(name, str):
                raise TypeError(f"{what}: keys must be str, got {type(name).__name__}")
            a = v if isinstance(v, np.ndarray) else np.asarray(v)
            if a.dtype not in _FROM_NUMPY:
                raise TypeError(f"{what}['{name}'] has dtype {a.dtype}, which kiln lacks")
            a = contiguous(a)
            t = view(a)
            st = L.lib.kiln_tensor_set_add(s, name.encode(), ctypes.byref(t))
            if st != L.OK:
                raise KilnError(f"{what}: cannot add '{name}'", st)
    except BaseException:
        L.lib.kiln_tensor_set_free(s)
        raise
    return s
