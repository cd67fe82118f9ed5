"""kiln: compile neural networks (ONNX, PyTorch modules, .kir) into native
libraries and run or train them from Python with NumPy arrays.

    import kiln
    model = kiln.compile(torch_module, example_input)   # or "model.onnx"
    y = model(x)                                          # NumPy in, NumPy out

A pure-Python package over libkiln's C API (include/kiln/kiln.h) through
ctypes; see docs/PYTHON.md.
"""
from ._core import KilnError
from ._lib import path as library_path
from .model import IO, Model, compile, load
from .quant import quantize
from .train import TrainStep

__version__ = "0.1.0"
__all__ = ["KilnError", "IO", "Model", "TrainStep", "compile", "load", "quantize",
           "library_path", "__version__"]
