"""The ctypes structs of kiln/_lib.py against the C compiler's layout of
include/kiln/kiln.h: every size and field offset."""
import ctypes
import os
import shutil
import subprocess

import pytest

from conftest import REPO
from kiln import _lib as L

STRUCTS = {  # ctypes class -> C type
    L.Error: "kiln_error", L.Tensor: "kiln_tensor", L.NamedTensor: "kiln_named_tensor",
    L.TensorSet: "kiln_tensor_set", L.ModelIO: "kiln_model_io",
    L.CompileTimes: "kiln_compile_times", L.CompileOpts: "kiln_compile_opts",
    L.TrainOpts: "kiln_train_opts", L.OnnxOpts: "kiln_onnx_opts",
    L.QuantOpts: "kiln_quant_opts", L.QuantLayer: "kiln_quant_layer",
    L.QuantOutput: "kiln_quant_output", L.QuantReport: "kiln_quant_report",
}


def test_struct_layouts_match_kiln_h(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <kiln/kiln.h>",
             "int main(void) {"]
    want = []
    for cls, ctype in STRUCTS.items():
        lines.append(f'printf("%zu\\n", sizeof({ctype}));')
        want.append((f"sizeof({ctype})", ctypes.sizeof(cls)))
        for name, *_ in cls._fields_:
            lines.append(f'printf("%zu\\n", offsetof({ctype}, {name}));')
            want.append((f"{ctype}.{name}", getattr(cls, name).offset))
    lines += ["return 0; }"]
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "abi"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(REPO, "include"), str(src), "-o",
                    str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True,
                                          text=True).stdout.split()]
    assert len(got) == len(want)
    bad = [f"{w[0]}: C {g}, ctypes {w[1]}" for g, w in zip(got, want) if g != w[1]]
    assert not bad, "\n".join(bad)
    assert L.MAX_RANK == 8
