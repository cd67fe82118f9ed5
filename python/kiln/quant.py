"""kiln.quantize: post-training int8 quantization through kiln_quantize."""
import contextlib
import ctypes
import os

import numpy as np

from . import _lib as L
from ._core import KilnError, as_array, check, fspath, new_error, view
from . import _source
from ._source import Graph

_METHODS = {"minmax": 0, "percentile": 1, "entropy": 2}


def _calib_arrays(g, calib):
    """calib as one array per graph input, in input order."""
    ins = g.inputs()
    if isinstance(calib, dict):
        unknown = set(calib) - {n for n, _ in ins}
        if unknown:
            raise ValueError(f"calib: the model has no input(s) {', '.join(sorted(unknown))} "
                             f"(its inputs: {', '.join(n for n, _ in ins)})")
        missing = [n for n, _ in ins if n not in calib]
        if missing:
            raise ValueError(f"calib: no data for input(s) {', '.join(missing)}")
        items = [calib[n] for n, _ in ins]
    elif isinstance(calib, (list, tuple)):
        items = list(calib)
    else:
        items = [calib]
    if len(items) != len(ins):
        raise ValueError(f"calib: the model has {len(ins)} input(s) "
                         f"({', '.join(n for n, _ in ins)}), got data for {len(items)}")
    return [as_array(a, dt, f"calib for '{n}'") for a, (n, dt) in zip(items, ins)]


def _report(r):
    c = r.contents
    layers = [dict(name=l.name.decode(), op=l.op.decode(), quantized=bool(l.quantized),
                   scale=l.scale, zero_point=l.zero_point, lo=l.lo, hi=l.hi,
                   saturation=l.saturation, rel_error=l.rel_error, max_error=l.max_error)
              for l in (c.layers[i] for i in range(c.nlayers))]
    outputs = [dict(name=o.name.decode(), rel_error=o.rel_error, cosine=o.cosine,
                    top1=o.top1) for o in (c.outputs[i] for i in range(c.noutputs))]
    method = {v: k for k, v in _METHODS.items()}.get(c.method, str(c.method))
    return dict(samples=int(c.samples), method=method, layers=layers, outputs=outputs)


@contextlib.contextmanager
def quantize_graph(g, calib, *, method="minmax", percentile=None, keep_float=(),
                   per_tensor_weights=False, batch=None, threads=None):
    """Yields (quantized Graph, report dict); the graph is freed on exit."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {', '.join(_METHODS)}, not {method!r}")
    arrays = _calib_arrays(g, calib)
    views = [view(a) for a in arrays]
    ptrs = (ctypes.POINTER(L.Tensor) * (len(views) + 1))(*[ctypes.pointer(v) for v in views])
    o = L.QuantOpts()
    o.method = _METHODS[method]
    o.percentile = float(percentile or 0)
    names = [str(k).encode() for k in keep_float]
    arr = (ctypes.c_char_p * (len(names) + 1))(*names)
    o.keep_float = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
    o.nkeep_float = len(names)
    o.per_tensor_weights = bool(per_tensor_weights)
    o.batch = int(batch or 0)
    o.threads = int(threads or 0)
    out = ctypes.c_void_p()
    rep = ctypes.POINTER(L.QuantReport)()
    err = new_error()
    st = L.lib.kiln_quantize(g.handle, ptrs, len(views), ctypes.byref(o), ctypes.byref(out),
                             ctypes.byref(rep), ctypes.byref(err))
    check(st, err)
    q = Graph(out.value)
    try:
        report = _report(rep) if rep else None
    finally:
        if rep:
            L.lib.kiln_quant_report_free(rep)
    try:
        yield q, report
    finally:
        q.close()


def export_onnx(g, path=None):
    """g as ONNX: written atomically to path (returned), or bytes."""
    err = new_error()
    if path is not None:
        check(L.lib.kiln_onnx_export(g.handle, fspath(path), ctypes.byref(err)), err)
        return os.fspath(path)
    data = ctypes.c_void_p()
    size = ctypes.c_size_t()
    check(L.lib.kiln_onnx_export_mem(g.handle, ctypes.byref(data), ctypes.byref(size),
                                     ctypes.byref(err)), err)
    try:
        return ctypes.string_at(data.value, size.value)
    finally:
        L.free(data)


def quantize(model, calib, output=None, *, example_inputs=None, method="minmax",
             percentile=None, keep_float=(), per_tensor_weights=False, batch=None,
             threads=None, report=False, bind=None):
    """Post-training int8 quantization (kiln_quantize; docs/QUANTIZATION.md).

    model: as for kiln.compile (a torch.nn.Module is traced on example_inputs,
    or on the first calibration sample when none is given).  calib: the
    calibration inputs: an array for a one-input model, else a list in input
    order or a dict by input name; each a stack of samples along axis 0.
    Returns the QDQ model as ONNX bytes, or writes it atomically to output
    and returns that path; with report=True, a (result, report) pair where
    report is a dict: samples, method, layers (per quantized layer: scale,
    zero_point, range, saturation, rel_error...) and outputs (rel_error,
    cosine, top1 against f32)."""
    if example_inputs is None and _source._is_torch_module(model):
        first = _calib_list_first(calib)
        example_inputs = tuple(np.ascontiguousarray(a[:1]) for a in first)
    src = _source.resolve(model, example_inputs)
    with _source.import_graph(src, bind) as g:
        with quantize_graph(g, calib, method=method, percentile=percentile,
                            keep_float=keep_float, per_tensor_weights=per_tensor_weights,
                            batch=batch, threads=threads) as (q, rep):
            result = export_onnx(q, output)
    return (result, rep) if report else result


def _calib_list_first(calib):
    items = list(calib.values()) if isinstance(calib, dict) else \
        list(calib) if isinstance(calib, (list, tuple)) else [calib]
    return [np.asarray(a) for a in items]
