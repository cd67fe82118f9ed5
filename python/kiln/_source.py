"""Where a model comes from: a file, ONNX bytes, an onnx.ModelProto or a
torch.nn.Module (exported with torch.onnx.export), imported into a kiln
graph through the C API."""
import copy
import ctypes
import hashlib
import inspect
import os
import tempfile
import warnings
import weakref

import numpy as np

from . import _lib as L
from ._core import KilnError, check, dict_to_tensor_set, fspath, new_error


class Graph:
    """Owns one kiln_graph; freed by close(), when collected, or at exit
    (weakref.finalize, which runs before the modules are torn down)."""

    def __init__(self, handle):
        self.handle = handle
        self._finalizer = weakref.finalize(self, L.lib.kiln_graph_free, handle)

    def close(self):
        self.handle = None
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def inputs(self):
        """[(name, numpy dtype)] of the graph's inputs, in order."""
        from ._core import np_dtype
        g = self.handle
        out = []
        for i in range(L.lib.kiln_graph_num_inputs(g)):
            v = L.lib.kiln_graph_input(g, i)
            out.append((L.lib.kiln_value_name(g, v).decode(),
                        np_dtype(L.lib.kiln_value_dtype(g, v))))
        return out


class Source:
    """A model argument resolved: kind is "onnx" (data: bytes, or path),
    "kir" (path) or "library" (path: an already compiled .so); key is a
    digest of everything the graph is made from, for the compile cache."""

    def __init__(self, kind, path=None, data=None, key=b"", label="<model>", name=None):
        self.kind, self.path, self.data, self.key, self.label = kind, path, data, key, label
        self.name = name  # a default C name for the library (a torch module's class)


def _is_torch_module(obj):
    try:
        import torch
    except ImportError:
        return False
    return isinstance(obj, torch.nn.Module)


def _digest(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


def _file_key(path):
    with open(path, "rb") as f:
        return f.read()


def resolve(model, example_inputs=None, *, training=False, dynamic_batch=True, opset=17):
    """A Source for model (see kiln.compile for what model may be)."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FileNotFoundError(f"kiln: no such model file: '{path}'")
        kind = L.lib.kiln_file_sniff(fspath(path))
        if kind == L.FILE_ONNX:
            return Source("onnx", path=path, key=_digest(b"onnx", _file_key(path)), label=path)
        if kind in (L.FILE_KIR, L.FILE_TEXT):  # FILE_TEXT: kiln_graph_load says what is wrong
            weights = os.path.splitext(path)[0] + ".safetensors"
            wkey = _file_key(weights) if os.path.isfile(weights) else b""
            return Source("kir", path=path, key=_digest(b"kir", _file_key(path), wkey),
                          label=path)
        if kind == L.FILE_ELF:
            return Source("library", path=path, label=path)
        what = L.lib.kiln_file_kind_name(kind).decode()
        raise ValueError(f"kiln: '{path}' is {what}, not a model (an ONNX model, a .kir "
                         "graph or a compiled library)")
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        return Source("onnx", data=data, key=_digest(b"onnx", data), label="<onnx bytes>")
    if hasattr(model, "SerializeToString") and hasattr(model, "graph"):  # onnx.ModelProto
        data = model.SerializeToString()
        return Source("onnx", data=data, key=_digest(b"onnx", data), label="<onnx.ModelProto>")
    if _is_torch_module(model):
        data = torch_to_onnx(model, example_inputs, training=training,
                             dynamic_batch=dynamic_batch, opset=opset)
        label = f"<torch {type(model).__name__}>"
        return Source("onnx", data=data, key=_digest(b"onnx", data), label=label,
                      name=type(model).__name__.lower())
    raise TypeError("kiln: a model is a path (.onnx, .kir, .so), ONNX bytes, an "
                    f"onnx.ModelProto or a torch.nn.Module, not {type(model).__name__}")


def import_graph(src, bind=None):
    """The kiln graph of a Source (a Graph the caller closes).  bind: {input
    name: array} for ONNX inputs the import needs as constants."""
    g = ctypes.c_void_p()
    err = new_error()
    if src.kind == "kir":
        if bind:
            raise ValueError("kiln: bind= applies to ONNX models only")
        st = L.lib.kiln_graph_load(fspath(src.path), ctypes.byref(g), ctypes.byref(err))
        check(st, err)
        return Graph(g.value)
    if src.kind != "onnx":
        raise ValueError(f"kiln: {src.label} is a compiled library, not a graph")
    spec = dict_to_tensor_set(bind, "bind") if bind else None
    try:
        o = L.OnnxOpts()
        if src.path is not None:
            o.path = fspath(src.path)
            o.dir = fspath(os.path.dirname(os.path.abspath(src.path)))
        else:
            o.path = src.label.encode()
        o.specialize = spec
        data = src.data
        st = L.lib.kiln_onnx_import_ex(data, len(data) if data is not None else 0,
                                       ctypes.byref(o), ctypes.byref(g), ctypes.byref(err))
    finally:
        if spec:
            L.lib.kiln_tensor_set_free(spec)
    check(st, err)
    return Graph(g.value)


def _forward_names(module, n):
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params[:n]]
    except (TypeError, ValueError):
        names = []
    if len(names) != n or len(set(names)) != n:
        names = ["input"] if n == 1 else [f"input{i}" for i in range(n)]
    return names


def torch_to_onnx(module, example_inputs, *, training=False, dynamic_batch=True, opset=17):
    """ONNX bytes of module traced on example_inputs in eval mode (the module's
    mode is restored).  Inputs are named after forward's parameters, outputs
    "output" (or output0, output1, ...); with dynamic_batch, dim 0 of every
    input and output that has the inputs' batch size is the symbol "N".
    training: for a train step, BatchNorm kept unfused (no Conv+BN folding)
    and no constant folding, so every parameter keeps its state_dict name."""
    import torch
    if example_inputs is None:
        raise ValueError("kiln: a torch.nn.Module needs example_inputs (a tensor or array, "
                         "or a tuple of them) to be traced")
    args = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    targs = []
    for a in args:
        if isinstance(a, np.ndarray):
            a = torch.from_numpy(np.ascontiguousarray(a))
        if not isinstance(a, torch.Tensor):
            raise TypeError("kiln: example_inputs must be tensors or NumPy arrays, not "
                            f"{type(a).__name__}")
        targs.append(a)
    targs = tuple(targs)
    names = _forward_names(module, len(targs))
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            outs = module(*targs)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        onames = ["output"] if len(outs) == 1 else [f"output{i}" for i in range(len(outs))]
        axes = None
        if dynamic_batch and targs and targs[0].dim() > 0:
            b = targs[0].shape[0]
            axes = {n: {0: "N"} for n, a in zip(names, targs) if a.dim() > 0 and a.shape[0] == b}
            axes.update({n: {0: "N"} for n, o in zip(onames, outs)
                         if isinstance(o, torch.Tensor) and o.dim() > 0 and o.shape[0] == b})
        mode = torch.onnx.TrainingMode.EVAL
        root = module
        if training:
            # For a train step every parameter and buffer must stay an
            # initializer of its own name.  In eval mode PyTorch merges
            # initializers of equal value (a fresh BatchNorm's weight and
            # running_var are both ones), unless the exported module's
            # `training` is set: so a shallow copy with only its own flag
            # set (every submodule stays in eval mode) is exported, with
            # PRESERVE (no Conv+BatchNorm fusion) and no constant folding.
            root = copy.copy(module)
            root.training = True
            mode = torch.onnx.TrainingMode.PRESERVE
        with tempfile.TemporaryDirectory(prefix="kiln_export_") as d:
            path = os.path.join(d, "model.onnx")
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "exported in inference mode" and such
                torch.onnx.export(root, targs, path, input_names=names, output_names=onames,
                                  dynamic_axes=axes, opset_version=opset, training=mode,
                                  do_constant_folding=not training)
            if len(os.listdir(d)) != 1:  # external data: a model of 2 GB or more
                raise ValueError("the export wrote external data (a model of 2 GB or more); "
                                 "export it to a folder yourself and pass the .onnx path")
            with open(path, "rb") as f:
                return f.read()
    except KilnError:
        raise
    except Exception as e:
        raise ValueError(f"kiln: torch.onnx.export of {type(module).__name__} failed: "
                         f"{e}") from e
    finally:
        module.train(was_training)
