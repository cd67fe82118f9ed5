"""Which ONNX Runtime run an int8 result of kiln's is held to.

ORT's x86 kernels for u8 activations x s8 weights multiply with vpmaddubsw
where the CPU has no VNNI (AVX2, and AVX-512 before Cascade Lake): it adds
two u8*s8 products into a saturating int16, so a pair past 32767 is
clipped and ORT's int8 result is not the exact integer one (ORT's
quantization docs name this; on an AVX2 AMD EPYC, MobileNetV2's QDQ model
came out 4x further from the exact Q/DQ result in ORT's int8 run than in
kiln's).  kiln's integer kernels sum exactly on every CPU.  So on such a
host the reference is ORT running the Q/DQ nodes as written (optimisations
off: dequantize, f32 op, quantize), which is exact up to the rounding at
each requantization; where VNNI is present it is ORT's int8 run itself.
"""


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def exact_u8s8():
    """Whether ORT's u8 x s8 kernels sum exactly on this CPU (x86 with VNNI
    or AMX, or not x86: its ARM kernels widen before adding)."""
    flags = cpu_flags()
    if "sse2" not in flags:
        return True
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def reference_session(ort, path):
    """(session, what) for the run kiln's int8 output is compared with."""
    if exact_u8s8():
        return (ort.InferenceSession(path, providers=["CPUExecutionProvider"]),
                "ORT int8")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return (ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]),
            "ORT running the Q/DQ nodes as written (this CPU has no VNNI: ORT's "
            "u8s8 kernels saturate int16 pair sums here)")
