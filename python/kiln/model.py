"""kiln.Model: a compiled library opened with kiln_load, run on NumPy arrays;
kiln.compile and kiln.load make one."""
import collections
import ctypes
import hashlib
import os
import shutil
import tempfile
import threading
import weakref

import numpy as np

from . import _lib as L
from ._core import KilnError, as_array, check, fspath, new_error, np_dtype, view
from . import _source

IO = collections.namedtuple("IO", "name dtype shape")
IO.__doc__ = """An input or output of a model: name, NumPy dtype and shape, where
a fixed size is an int, a symbolic one (the batch) its symbol's name ("N"),
and a size computed from symbols None."""


def _io(p):
    io = p.contents
    shape = []
    for k in range(io.rank):
        if io.dims[k] >= 0:
            shape.append(int(io.dims[k]))
        else:
            n = io.dim_names[k].decode() if io.dim_names[k] else "?"
            shape.append(None if n == "?" else n)
    return IO(io.name.decode(), np_dtype(io.dtype), tuple(shape))


def _shape_str(shape):
    return "(" + ", ".join(str(d) if d is not None else "?" for d in shape) + \
        ("," if len(shape) == 1 else "") + ")"


class Model:
    """A compiled model.  Call it like a function on NumPy arrays (or
    anything np.asarray takes), positionally in input order or by input
    name; it returns one array, or a tuple when the model has several
    outputs.  ``out=`` takes preallocated output arrays (C-contiguous, of
    the output's dtype and shape) to run without allocating.

    Inputs that are C-contiguous NumPy arrays of the input's dtype are
    passed to the library without a copy; others are made contiguous once.
    Outputs are allocated as NumPy arrays and written by the library in
    place (kiln_model_run_into).  One Model is one kiln context: calls from
    several threads are serialized by a lock.  Free it with close(), a
    ``with`` block, or by dropping the last reference."""

    def __init__(self, handle, source=None):
        self._h = handle
        self._lock = threading.Lock()
        self._threads = None
        self.source = source
        self._finalizer = weakref.finalize(self, L.lib.kiln_model_free, handle)
        n_in = L.lib.kiln_model_num_inputs(handle)
        n_out = L.lib.kiln_model_num_outputs(handle)
        self._inputs = tuple(_io(L.lib.kiln_model_input(handle, i)) for i in range(n_in))
        self._outputs = tuple(_io(L.lib.kiln_model_output(handle, i)) for i in range(n_out))
        self._names = {io.name: i for i, io in enumerate(self._inputs)}

    # ---- introspection ----
    @property
    def name(self):
        return L.lib.kiln_model_name(self._handle()).decode()

    @property
    def inputs(self):
        """Tuple of IO(name, dtype, shape), in the order calls take them."""
        return self._inputs

    @property
    def outputs(self):
        return self._outputs

    @property
    def threads(self):
        """Threads of the model's parallel loops (None: kiln's default,
        $KILN_NUM_THREADS or 1).  Setting it calls kiln_model_set_threads."""
        return self._threads

    @threads.setter
    def threads(self, n):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"threads must be an int >= 1, got {n!r}")
        err = new_error()
        with self._lock:
            check(L.lib.kiln_model_set_threads(self._handle(), int(n), ctypes.byref(err)), err)
        self._threads = int(n)

    def _handle(self):
        if not self._finalizer.alive:
            raise ValueError("kiln: this model has been closed")
        return self._h

    def close(self):
        """Frees the kiln context (idempotent)."""
        with self._lock:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if not self._finalizer.alive:
            return "<kiln.Model (closed)>"
        sig = lambda ios: ", ".join(f"{io.name}: {io.dtype}{_shape_str(io.shape)}" for io in ios)
        return f"<kiln.Model {self.name}({sig(self._inputs)}) -> ({sig(self._outputs)})>"

    # ---- running ----
    def _arrange(self, args, kwargs):
        """The inputs in signature order, as arrays kiln can read."""
        n = len(self._inputs)
        if len(args) > n:
            raise TypeError(f"model '{self.name}' takes {n} input(s) "
                            f"({', '.join(io.name for io in self._inputs)}), got {len(args)}")
        slots = list(args) + [None] * (n - len(args))
        given = [True] * len(args) + [False] * (n - len(args))
        for k, v in kwargs.items():
            i = self._names.get(k)
            if i is None:
                raise TypeError(f"model '{self.name}' has no input '{k}' (its inputs: "
                                f"{', '.join(io.name for io in self._inputs)})")
            if given[i]:
                raise TypeError(f"input '{k}' given twice (by position and by name)")
            slots[i], given[i] = v, True
        missing = [self._inputs[i].name for i in range(n) if not given[i]]
        if missing:
            raise TypeError(f"model '{self.name}': missing input(s) {', '.join(missing)}")
        arrays = [as_array(v, io.dtype, f"input '{io.name}'") for v, io in zip(slots, self._inputs)]
        self._check_shapes(arrays)
        return arrays

    def _check_shapes(self, arrays):
        syms = {}
        for a, io in zip(arrays, self._inputs):
            want = _shape_str(io.shape)
            if a.ndim != len(io.shape):
                raise ValueError(f"input '{io.name}' has shape {a.shape}, expected {want} "
                                 f"(rank {len(io.shape)}, not {a.ndim})")
            for k, (d, w) in enumerate(zip(a.shape, io.shape)):
                if isinstance(w, int) and d != w:
                    raise ValueError(f"input '{io.name}' has shape {a.shape}, expected {want} "
                                     f"(dim {k} must be {w})")
                if isinstance(w, str):
                    if d < 1:
                        raise ValueError(f"input '{io.name}' has shape {a.shape}: {w} must be "
                                         "at least 1")
                    if syms.setdefault(w, (d, io.name))[0] != d:
                        raise ValueError(f"input '{io.name}' has {w} = {d} (dim {k}) but input "
                                         f"'{syms[w][1]}' has {w} = {syms[w][0]}")

    def _outputs_for(self, h, ins, n_in, out):
        """Output arrays: the caller's (checked) or new ones of the shapes the
        inputs give."""
        n_out = len(self._outputs)
        if out is not None:
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if len(outs) != n_out:
                raise ValueError(f"out: model '{self.name}' has {n_out} output(s), got "
                                 f"{len(outs)}")
        else:
            outs = [None] * n_out
        err = new_error()
        rank = ctypes.c_int()
        dims = (ctypes.c_int64 * L.MAX_RANK)()
        for i, io in enumerate(self._outputs):
            st = L.lib.kiln_model_output_shape(h, ins, n_in, i, ctypes.byref(rank), dims,
                                               ctypes.byref(err))
            check(st, err)
            shape = tuple(dims[k] for k in range(rank.value))
            o = outs[i]
            if o is None:
                outs[i] = np.empty(shape, io.dtype)
                continue
            if not isinstance(o, np.ndarray):
                raise TypeError(f"out[{i}] must be a NumPy array, not {type(o).__name__}")
            if o.dtype != io.dtype or o.shape != shape:
                raise ValueError(f"out[{i}] ('{io.name}') is {o.dtype}{o.shape}, the model "
                                 f"writes {io.dtype}{shape}")
            if not (o.flags.c_contiguous and o.flags.aligned and o.flags.writeable):
                raise ValueError(f"out[{i}] ('{io.name}') must be C-contiguous and writeable")
        return outs

    def run(self, *args, out=None, **kwargs):
        """The same as calling the model; always returns a tuple."""
        arrays = self._arrange(args, kwargs)
        views = [view(a) for a in arrays]
        ins = (ctypes.POINTER(L.Tensor) * (len(views) + 1))(*[ctypes.pointer(v) for v in views])
        err = new_error()
        with self._lock:
            h = self._handle()
            outs = self._outputs_for(h, ins, len(views), out)
            oviews = [view(o) for o in outs]
            ops = (ctypes.POINTER(L.Tensor) * (len(oviews) + 1))(
                *[ctypes.pointer(v) for v in oviews])
            st = L.lib.kiln_model_run_into(h, ins, len(views), ops, len(oviews),
                                           ctypes.byref(err))
        check(st, err)
        return tuple(outs)

    def __call__(self, *args, out=None, **kwargs):
        outs = self.run(*args, out=out, **kwargs)
        return outs[0] if len(outs) == 1 else outs


# ---- making models ----

def _open(path, source=None, threads=None):
    h = ctypes.c_void_p()
    err = new_error()
    check(L.lib.kiln_load(fspath(path), ctypes.byref(h), ctypes.byref(err)), err)
    m = Model(h.value, source)
    if threads is not None:
        try:
            m.threads = threads
        except BaseException:
            m.close()
            raise
    return m


def load(path, *, threads=None):
    """Opens a library compiled by ``kiln compile`` (or kiln.compile with a
    cache_dir) as a Model."""
    return _open(os.fspath(path), os.fspath(path), threads)


def compile_opts(name=None, cpu=None, features=None, passes=None, conv=None, jobs=0,
                 cache_dir=None):
    """A kiln_compile_opts and the byte strings it points at (keep both)."""
    o = L.CompileOpts()
    keep = []

    def s(v):
        if v is None:
            return None
        b = os.fsencode(v) if isinstance(v, os.PathLike) else str(v).encode()
        keep.append(b)
        return b
    o.name, o.cpu, o.features = s(name), s(cpu), s(features)
    o.passes, o.conv, o.cache_dir = s(passes), s(conv), s(cache_dir)
    o.jobs = int(jobs)
    return o, keep


def _cache_key(src, extra):
    """A file name for the compiled library: kiln's version, this libkiln
    (path, size, mtime), the options and everything the model is made of."""
    h = hashlib.sha256()
    st = os.stat(L.path) if os.sep in L.path else None
    h.update(repr((L.path, st.st_size if st else 0, st.st_mtime_ns if st else 0)).encode())
    h.update(src.key)
    for e in extra:
        h.update(len(e).to_bytes(8, "little"))
        h.update(e)
    return h.hexdigest()[:32]


def _array_bytes(arrays):
    out = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        out.append(repr((a.dtype.str, a.shape)).encode() + a.tobytes())
    return b"".join(out)


def compile(model, example_inputs=None, *, threads=None, int8=False, calib=None,
            calib_method="minmax", cache_dir=None, name=None, cpu=None, features=None,
            passes=None, conv=None, jobs=0, bind=None, dynamic_batch=True, opset=17):
    """Compiles model into a library and opens it as a kiln.Model.

    model: a path (.onnx, .kir; a compiled .so is just opened), ONNX bytes,
    an onnx.ModelProto, or a torch.nn.Module traced on example_inputs (a
    tensor or array, or a tuple of them) by torch.onnx.export in eval mode;
    with dynamic_batch the batch dim is the symbol "N", so the model takes
    any batch size.  int8: quantize first (kiln.quantize; calib is the
    calibration data, calib_method "minmax", "percentile" or "entropy").
    cache_dir: keep the library there under a digest of the model and the
    options and reuse it next time; None: compile into a temporary folder
    that is removed once the library is open.  threads: see Model.threads.
    name, cpu, features, passes, conv, jobs: kiln_compile_opts.  bind:
    {ONNX input name: array} for inputs the import needs as constants."""
    src = _source.resolve(model, example_inputs, dynamic_batch=dynamic_batch, opset=opset)
    if src.kind == "library":
        return load(src.path, threads=threads)
    if int8 and calib is None:
        raise ValueError("kiln.compile: int8=True needs calib (calibration inputs)")
    opts = dict(name=name or src.name, cpu=cpu, features=features, passes=passes, conv=conv)
    extra = [repr(sorted(opts.items())).encode(), repr((bool(int8), calib_method)).encode()]
    if bind:
        extra.append(repr(sorted(bind)).encode() + _array_bytes(bind[k] for k in sorted(bind)))
    tmp = None
    try:
        if cache_dir is not None:
            os.makedirs(cache_dir, exist_ok=True)
            if int8:
                extra.append(_array_bytes(_calib_list(calib)))
            so = os.path.join(os.fspath(cache_dir), _cache_key(src, extra) + ".so")
            if os.path.isfile(so):
                return _open(so, src.label, threads)
        else:
            tmp = tempfile.mkdtemp(prefix="kiln_compile_")
            so = os.path.join(tmp, "model.so")
        with _source.import_graph(src, bind) as g:
            if int8:
                from .quant import quantize_graph
                with quantize_graph(g, calib, method=calib_method) as (q, _):
                    _compile_graph(q, so, opts, jobs, cache_dir)
            else:
                _compile_graph(g, so, opts, jobs, cache_dir)
        return _open(so, src.label, threads)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)  # the open library stays mapped


def _calib_list(calib):
    if isinstance(calib, dict):
        return [calib[k] for k in sorted(calib)]
    if isinstance(calib, (list, tuple)):
        return list(calib)
    return [calib]


def _compile_graph(g, so, opts, jobs, cache_dir):
    o, keep = compile_opts(jobs=jobs, cache_dir=cache_dir, **opts)
    err = new_error()
    check(L.lib.kiln_compile(g.handle, fspath(so), ctypes.byref(o), ctypes.byref(err)), err)
