"""ctypes declarations of libkiln's C API (include/kiln/kiln.h).

Only what the package uses is declared.  Every struct mirrors the header
field for field; tests/test_abi.py compiles a C program against kiln.h and
checks every size and offset here against the compiler's.

The library is found, in order, at $KILN_LIBRARY (a full path; when set
it must work, there is no fallback), by ctypes.util.find_library("kiln")
(an installed prefix), then in the build folders of the kiln source tree
this package sits in (build/, then other build*/ folders that are not
sanitizer builds); ImportError names every place tried.
"""
import ctypes
import ctypes.util
import os
import pathlib

from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_int, c_int64,
                    c_size_t, c_uint32, c_uint64, c_void_p)

MAX_RANK = 8

# kiln_status
OK, EINVAL, ESHAPE, EUNSUPPORTED, EPARSE, ENOMEM, EIO, EVERIFY = range(8)
STATUS_NAMES = ("KILN_OK", "KILN_EINVAL", "KILN_ESHAPE", "KILN_EUNSUPPORTED", "KILN_EPARSE",
                "KILN_ENOMEM", "KILN_EIO", "KILN_EVERIFY")

# kiln_dtype
(DT_INVALID, F32, F64, F16, BF16, I8, U8, I32, I64, BOOL) = range(10)

# kiln_file_kind
(FILE_UNKNOWN, FILE_KIR, FILE_ONNX, FILE_ELF, FILE_NPY, FILE_SAFETENSORS, FILE_TEXT) = range(7)


class Error(Structure):
    _fields_ = [("code", c_int), ("msg", c_char * 1024)]


class Tensor(Structure):
    _fields_ = [("dtype", c_int), ("rank", c_int), ("shape", c_int64 * MAX_RANK),
                ("data", c_void_p)]


class NamedTensor(Structure):
    _fields_ = [("name", c_char_p), ("tensor", POINTER(Tensor))]


class TensorSet(Structure):
    _fields_ = [("count", c_int), ("items", POINTER(NamedTensor))]


class ModelIO(Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("rank", c_int),
                ("dims", c_int64 * MAX_RANK), ("dim_names", c_char_p * MAX_RANK)]


class CompileTimes(Structure):
    _fields_ = [("total", c_double), ("lower", c_double), ("emit", c_double),
                ("llvm", c_double), ("optimize", c_double), ("codegen", c_double),
                ("link", c_double), ("parts", c_int), ("jobs", c_int), ("cached", c_int),
                ("weights_bytes", ctypes.c_ulonglong)]


class CompileOpts(Structure):
    _fields_ = [("name", c_char_p), ("cpu", c_char_p), ("features", c_char_p),
                ("emit", c_char_p), ("passes", c_char_p), ("conv", c_char_p), ("jobs", c_int),
                ("times", POINTER(CompileTimes)), ("cache_dir", c_char_p),
                ("target", c_char_p), ("cuda_arch", c_char_p), ("cuda_math", c_char_p)]


class TrainOpts(Structure):
    _fields_ = [("optim", c_int), ("momentum", c_double), ("dampening", c_double),
                ("nesterov", c_bool), ("weight_decay", c_double), ("beta1", c_double),
                ("beta2", c_double), ("eps", c_double), ("amsgrad", c_bool),
                ("clip_norm", c_double), ("accum_steps", c_int), ("loss", c_int),
                ("output", c_char_p)]


class OnnxOpts(Structure):
    _fields_ = [("path", c_char_p), ("dir", c_char_p), ("report", POINTER(c_void_p)),
                ("specialize", POINTER(TensorSet))]


class QuantOpts(Structure):
    _fields_ = [("method", c_int), ("percentile", c_double),
                ("keep_float", POINTER(c_char_p)), ("nkeep_float", c_int),
                ("per_tensor_weights", c_bool), ("batch", c_int64), ("threads", c_int),
                ("compile", POINTER(CompileOpts))]


class QuantLayer(Structure):
    _fields_ = [("name", c_char_p), ("op", c_char_p), ("quantized", c_bool),
                ("scale", c_double), ("zero_point", c_int), ("lo", c_double),
                ("hi", c_double), ("saturation", c_double), ("rel_error", c_double),
                ("max_error", c_double)]


class QuantOutput(Structure):
    _fields_ = [("name", c_char_p), ("rel_error", c_double), ("cosine", c_double),
                ("top1", c_double)]


class QuantReport(Structure):
    _fields_ = [("samples", c_int64), ("method", c_int), ("nlayers", c_int),
                ("noutputs", c_int), ("layers", POINTER(QuantLayer)),
                ("outputs", POINTER(QuantOutput))]


# name -> (restype, argtypes)
_P = POINTER
_graph = c_void_p
_model = c_void_p
_err = _P(Error)
PROTOTYPES = {
    "kiln_status_str": (c_char_p, [c_int]),
    "kiln_dtype_name": (c_char_p, [c_int]),
    "kiln_file_sniff": (c_int, [c_char_p]),
    "kiln_file_kind_name": (c_char_p, [c_int]),
    "kiln_tensor_free": (None, [_P(Tensor)]),
    "kiln_tensor_nbytes": (c_size_t, [_P(Tensor)]),
    "kiln_tensor_set_new": (_P(TensorSet), []),
    "kiln_tensor_set_add": (c_int, [_P(TensorSet), c_char_p, _P(Tensor)]),
    "kiln_tensor_set_free": (None, [_P(TensorSet)]),
    "kiln_graph_free": (None, [_graph]),
    "kiln_graph_name": (c_char_p, [_graph]),
    "kiln_graph_num_inputs": (c_int, [_graph]),
    "kiln_graph_input": (c_uint32, [_graph, c_int]),
    "kiln_value_name": (c_char_p, [_graph, c_uint32]),
    "kiln_value_dtype": (c_int, [_graph, c_uint32]),
    "kiln_graph_load": (c_int, [c_char_p, _P(_graph), _err]),
    "kiln_graph_load_trained": (c_int, [_graph, c_char_p, _err]),
    "kiln_onnx_import_ex": (c_int, [c_void_p, c_size_t, _P(OnnxOpts), _P(_graph), _err]),
    "kiln_onnx_export": (c_int, [_graph, c_char_p, _err]),
    "kiln_onnx_export_mem": (c_int, [_graph, _P(c_void_p), _P(c_size_t), _err]),
    "kiln_compile": (c_int, [_graph, c_char_p, _P(CompileOpts), _err]),
    "kiln_train_graph_from_inference": (c_int, [_graph, c_uint64, _P(_graph), _err]),
    "kiln_compile_train": (c_int, [_graph, _graph, _P(TrainOpts), c_int64, c_char_p,
                                   _P(CompileOpts), _err]),
    "kiln_quantize": (c_int, [_graph, _P(_P(Tensor)), c_int, _P(QuantOpts), _P(_graph),
                              _P(_P(QuantReport)), _err]),
    "kiln_quant_report_free": (None, [_P(QuantReport)]),
    "kiln_load": (c_int, [c_char_p, _P(_model), _err]),
    "kiln_model_free": (None, [_model]),
    "kiln_model_name": (c_char_p, [_model]),
    "kiln_model_set_threads": (c_int, [_model, c_int, _err]),
    "kiln_model_num_inputs": (c_int, [_model]),
    "kiln_model_num_outputs": (c_int, [_model]),
    "kiln_model_input": (_P(ModelIO), [_model, c_int]),
    "kiln_model_output": (_P(ModelIO), [_model, c_int]),
    "kiln_model_output_shape": (c_int, [_model, _P(_P(Tensor)), c_int, c_int, _P(c_int),
                                        _P(c_int64), _err]),
    "kiln_model_run_into": (c_int, [_model, _P(_P(Tensor)), c_int, _P(_P(Tensor)), c_int,
                                    _err]),
    "kiln_model_trainable": (c_bool, [_model]),
    "kiln_model_train_step": (c_int, [_model, _P(Tensor), _P(Tensor), c_double,
                                      _P(c_double), _err]),
    "kiln_model_steps": (c_int64, [_model]),
    "kiln_model_state": (_P(TensorSet), [_model]),
    "kiln_model_set_state": (c_int, [_model, _P(TensorSet), _err]),
    "kiln_model_save": (c_int, [_model, c_char_p, _err]),
    "kiln_model_load": (c_int, [_model, c_char_p, _err]),
}


def _candidates():
    """(description, path or name) in the order they are tried."""
    out = []
    env = os.environ.get("KILN_LIBRARY")
    if env:
        out.append(("$KILN_LIBRARY", env))
    found = ctypes.util.find_library("kiln")
    out.append(('ctypes.util.find_library("kiln")', found))
    root = pathlib.Path(__file__).resolve().parents[2]
    if not (root / "include" / "kiln" / "kiln.h").is_file():
        out.append(("the repository's build folders", None))  # an installed package
        return out
    builds = [root / "build"] + sorted(p for p in root.glob("build*") if p.name != "build")
    for b in builds:
        cache = b / "CMakeCache.txt"
        if cache.is_file() and "KILN_SANITIZE:BOOL=ON" in cache.read_text(errors="replace"):
            continue  # needs libasan preloaded: not loadable into a plain python
        out.append(("the repository's build folder", str(b / "libkiln.so")))
    return out


def _open():
    tried = []
    for what, where in _candidates():
        if tried and tried[0].startswith("$KILN_LIBRARY"):
            break  # set but unusable: an error, not a silent fallback to another library
        if where is None:
            tried.append(f"{what}: nothing found" if "find_library" in what else
                         f"{what}: none (this package is not in a kiln source tree)")
            continue
        if os.sep in where and not os.path.isfile(where):
            tried.append(f"{what}: {where} does not exist")
            continue
        try:
            lib = ctypes.CDLL(where)
        except OSError as e:
            tried.append(f"{what}: {where}: {e}")
            continue
        missing = [n for n in PROTOTYPES if not hasattr(lib, n)]
        if missing:
            tried.append(f"{what}: {where} lacks {', '.join(missing[:3])}"
                         f"{' ...' if len(missing) > 3 else ''} (an older libkiln?)")
            continue
        return lib, where
    raise ImportError("kiln: cannot find libkiln.so; tried:\n  " + "\n  ".join(tried) +
                      "\nBuild it (cmake --build build, target kiln_shared), install kiln, "
                      "or set KILN_LIBRARY to its full path.")


lib, path = _open()
for _name, (_res, _args) in PROTOTYPES.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [c_void_p]
_libc.free.restype = None
free = _libc.free
