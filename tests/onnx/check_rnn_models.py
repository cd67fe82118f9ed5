#!/usr/bin/env python3
"""kiln vs ONNX Runtime on recurrent models (RNN, GRU, LSTM unrolled at import).

    .venv/bin/python tests/onnx/check_rnn_models.py KILN OUT_DIR [NAME...]

Names (default: all):
  lstm_op13, lstm_op17, gru_op13, gru_op17
      PyTorch sequence classifiers: a bidirectional nn.LSTM / nn.GRU layer,
      a second (forward) one on its output, batch_first, then a Linear on
      the last step; exported at that opset with a fixed sequence length
      (7) and a dynamic batch ("N"; torch then writes the zero initial state
      as ConstantOfShape of a shape holding N).  Run at batch 1 and 3.
  lstm_dyn_op13, lstm_dyn_op17, gru_dyn_op13, gru_dyn_op17
      the same classifiers exported with a dynamic batch AND sequence length
      ("N", "T"): imported as kiln's fused LSTM / GRU; ONE compiled library
      and the interpreter run at (batch, T) = (1, 7), (3, 5), (2, 12), and
      kiln's ONNX export of the import runs in ONNX Runtime too.
  onnx_ops
      single RNN / GRU / LSTM nodes built with onnx.helper over what the
      import handles: every direction, layout 1 (ORT has none: compared
      with its layout-0 twin, transposed), sequence_lens as an initializer
      and as a graph input, initial states, clip, peepholes, input_forget,
      linear_before_reset, non-default activations, opset 7.

Each model runs through kiln's interpreter (`KILN run MODEL.onnx`) and as a
library (`KILN compile`, `KILN run M.so`), and every output must agree
with ONNX Runtime's within 1e-4 + 1e-4 * |ORT|; the line per model prints
the largest absolute and relative error of each.

Runs with the venv of scripts/setup-venv.sh (onnxruntime, with Debian's
torch and onnx through system site packages).  Exits 77 (ctest's skip code)
when onnxruntime or torch is missing, 1 when a model fails, 0 otherwise.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check_bench_models import check_models, run  # noqa: E402

TOL = 1e-4
SEQ, FEAT, HIDDEN, CLASSES = 7, 6, 8, 4
TORCH_MODELS = ("lstm_op13", "lstm_op17", "gru_op13", "gru_op17")
DYN_MODELS = ("lstm_dyn_op13", "lstm_dyn_op17", "gru_dyn_op13", "gru_dyn_op17")
DYN_SIZES = ((1, 7), (3, 5), (2, 12))  # (batch, sequence length)
DEFAULT = TORCH_MODELS + DYN_MODELS + ("onnx_ops",)


def compare(np, got, want):
    """(max abs error, max relative error, why it fails or None)."""
    if got.shape != want.shape:
        return 0.0, 0.0, f"shape {got.shape}, ORT {want.shape}"
    err = np.abs(got.astype(np.float64) - want)
    rel = err / np.maximum(np.abs(want), 1e-6)
    bad = ~(err <= TOL + TOL * np.abs(want))
    why = (f"{int(bad.sum())} of {want.size} values differ, max abs error "
           f"{float(err.max()):.3g}") if bad.any() else None
    return float(err.max(initial=0)), float(rel.max(initial=0)), why


def kiln_outputs(np, kiln, model, feeds, names, out, tag, env=None):
    """{backend: [outputs]} from the interpreter and the compiled library."""
    args = []
    for k, v in feeds.items():
        path = os.path.join(out, f"{tag}_in_{k}.npy")
        np.save(path, v)
        args += ["-i", f"{k}={path}"]
    so = os.path.join(out, f"{tag}.so")
    run([kiln, "compile", model, "-o", so])
    res = {}
    for backend, target in (("interp", model), ("so", so)):
        d = os.path.join(out, f"{tag}_{backend}")
        run([kiln, "run", target] + args + ["-o", d], env)
        res[backend] = [np.load(os.path.join(d, n.replace("/", "_") + ".npy")) for n in names]
    return res


def check_against(np, res, want):
    """Worst errors per backend over the outputs; why it fails or None."""
    line, why = [], None
    for backend, got in res.items():
        ea = er = 0.0
        for g, w in zip(got, want):
            a, r, bad = compare(np, g, w)
            ea, er = max(ea, a), max(er, r)
            why = why or (f"{backend}: {bad}" if bad else None)
        line.append(f"{backend} max abs {ea:.2e} rel {er:.2e}")
    return ", ".join(line), why


# ---- PyTorch sequence classifiers ----------------------------------------------

def torch_model(torch, cell):
    nn = torch.nn

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            rnn = nn.LSTM if cell == "lstm" else nn.GRU
            self.r1 = rnn(FEAT, HIDDEN, batch_first=True, bidirectional=True)
            self.r2 = rnn(2 * HIDDEN, HIDDEN, batch_first=True)
            self.fc = nn.Linear(HIDDEN, CLASSES)

        def forward(self, x):
            y, _ = self.r1(x)
            y, _ = self.r2(y)
            return self.fc(y[:, -1, :])

    torch.manual_seed(3)
    return Classifier().eval()


def check_torch(np, ort, torch, kiln, out, name):
    cell, opset = name.split("_op")
    model = os.path.join(out, f"{name}.onnx")
    import warnings
    with warnings.catch_warnings():  # torch warns about GRU with batch != 1
        warnings.simplefilter("ignore")
        torch.onnx.export(torch_model(torch, cell), (torch.randn(2, SEQ, FEAT),), model,
                          opset_version=int(opset), input_names=["x"],
                          output_names=["logits"],
                          dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}})
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    lines = []
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, SEQ, FEAT), dtype=np.float32)
        want = sess.run(None, {"x": x})
        res = kiln_outputs(np, kiln, model, {"x": x}, ["logits"], out, f"{name}_b{batch}")
        line, why = check_against(np, res, want)
        if why:
            return f"batch {batch}: {why}"
        spread = float(np.abs(want[0] - want[0][0]).max())
        if batch > 1 and spread < 100 * TOL:
            return f"batch {batch}: the rows' outputs differ by only {spread:.3g}"
        lines.append(f"batch {batch}: {line}")
    print(f"{name}: " + "; ".join(lines))
    return None


def check_torch_dyn(np, ort, torch, kiln, out, name):
    """A dynamic batch and sequence length: one library for every size."""
    cell, opset = name.split("_dyn_op")
    model = os.path.join(out, f"{name}.onnx")
    import warnings
    with warnings.catch_warnings():  # torch warns about GRU with batch != 1
        warnings.simplefilter("ignore")
        torch.onnx.export(torch_model(torch, cell), (torch.randn(2, SEQ, FEAT),), model,
                          opset_version=int(opset), input_names=["x"],
                          output_names=["logits"],
                          dynamic_axes={"x": {0: "N", 1: "T"}, "logits": {0: "N"}})
    so, back = os.path.join(out, f"{name}.so"), os.path.join(out, f"{name}_kiln.onnx")
    run([kiln, "compile", model, "-o", so])
    run([kiln, "export", model, "-o", back])
    import re
    kir = [re.sub(r' loc\("[^"]*":\d+\)', "", run([kiln, "opt", f])) for f in (model, back)]
    if kir[0] != kir[1] or f" = {cell} " not in kir[0]:
        return f"import -> export -> import is not the same graph with one fused {cell}"
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    sess_back = ort.InferenceSession(back, providers=["CPUExecutionProvider"])
    lines = []
    for batch, seq in DYN_SIZES:
        x = np.random.default_rng(batch * 100 + seq).standard_normal((batch, seq, FEAT),
                                                                      dtype=np.float32)
        want = sess.run(None, {"x": x})
        xin = os.path.join(out, f"{name}_b{batch}_t{seq}_x.npy")
        np.save(xin, x)
        res = {}
        for backend, target in (("interp", model), ("so", so)):
            d = os.path.join(out, f"{name}_b{batch}_t{seq}_{backend}")
            run([kiln, "run", target, "-i", f"x={xin}", "-o", d])
            res[backend] = [np.load(os.path.join(d, "logits.npy"))]
        res["export_ort"] = sess_back.run(None, {"x": x})
        line, why = check_against(np, res, want)
        if why:
            return f"batch {batch}, T {seq}: {why}"
        lines.append(f"(N {batch}, T {seq}): {line}")
    print(f"{name}: " + "; ".join(lines))
    return None


# ---- single nodes built with onnx.helper ----------------------------------------

def node_case(np, ort, kiln, out, rng, spec):
    """Builds, runs and compares one node; returns (line, why)."""
    import onnx
    import onnx.numpy_helper
    from onnx import TensorProto as TP, helper as h
    op, name, ndir, attrs, inputs = spec["op"], spec["name"], spec["ndir"], spec["attrs"], \
        spec["inputs"]
    layout, opset, lens = spec.get("layout", 0), spec.get("opset", 14), spec.get("lens")
    dyn = spec.get("dyn", False)  # X's time dim the symbol "T": kiln's fused op
    S, B, I, H = 5, 3, 4, 6
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    tw = lambda a: np.swapaxes(a, 0, 1).copy()  # noqa: E731
    state = (B, ndir, H) if layout else (ndir, B, H)
    vals = {"W": rng.standard_normal((ndir, G * H, I)) * 0.5,
            "R": rng.standard_normal((ndir, G * H, H)) * 0.5,
            "B": rng.standard_normal((ndir, 2 * G * H)) * 0.5,
            "initial_h": rng.standard_normal(state), "initial_c": rng.standard_normal(state),
            "P": rng.standard_normal((ndir, 3 * H)) * 0.5}
    vals = {k: v.astype(np.float32) for k, v in vals.items()}
    x = rng.standard_normal((B, S, I) if layout else (S, B, I)).astype(np.float32)
    feeds = {"X": x}
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    ins = [n if n == "X" or n in inputs or (n == "sequence_lens" and lens) else ""
           for n in order[:8 if op == "LSTM" else 6]]
    while ins[-1] == "":
        ins.pop()
    xdims = lambda shape: [("T" if dyn and k == (1 if layout else 0) else d)  # noqa: E731
                           for k, d in enumerate(shape)]
    ginputs, inits, inits0 = [h.make_tensor_value_info("X", TP.FLOAT, xdims(x.shape))], [], []
    for n in ins[1:]:
        if n == "sequence_lens":
            v = np.array(lens[1], dtype=np.int32)
            if lens[0] == "input":
                feeds[n] = v
                ginputs.append(h.make_tensor_value_info(n, TP.INT32, v.shape))
                continue
        elif n:
            v = vals[n]
        else:
            continue
        inits.append(onnx.numpy_helper.from_array(v, n))
        inits0.append(onnx.numpy_helper.from_array(tw(v) if layout and n.startswith("initial")
                                                   else v, n))
    gouts = [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outs]

    def save(nodeattrs, gin, inis, path):
        node = h.make_node(op, ins, outs, hidden_size=H, **nodeattrs)
        m = h.make_model(h.make_graph([node], name, gin, gouts, inis),
                         opset_imports=[h.make_opsetid("", opset)])
        m.ir_version = 8
        onnx.save(m, path)
        return path

    model = save(dict(attrs, **({"layout": 1} if layout else {})), ginputs, inits,
                 os.path.join(out, f"{name}.onnx"))
    if layout:  # ORT has no layout 1: its layout-0 twin, outputs transposed back
        layout = 0
        gin0 = [h.make_tensor_value_info("X", TP.FLOAT, xdims(tw(x).shape))] + ginputs[1:]
        twin = save(attrs, gin0, inits0, os.path.join(out, f"{name}_layout0.onnx"))
        want = ort.InferenceSession(twin, providers=["CPUExecutionProvider"]).run(
            None, dict(feeds, X=tw(x)))
        want = [np.transpose(w, (2, 0, 1, 3)) if w.ndim == 4 else tw(w) for w in want]
    else:
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    res = kiln_outputs(np, kiln, model, feeds, outs, out, name)
    return check_against(np, res, want)


def node_specs():
    full = ["W", "R", "B", "initial_h", "initial_c", "P"]
    specs = []
    for op in ("RNN", "GRU", "LSTM"):
        for d, nd in (("forward", 1), ("reverse", 1), ("bidirectional", 2)):
            for layout in (0, 1):
                specs.append(dict(op=op, name=f"{op}_{d}_layout{layout}", ndir=nd,
                                  attrs={"direction": d}, inputs=full, layout=layout))
            specs.append(dict(op=op, name=f"{op}_{d}_lens_init", ndir=nd,
                              attrs={"direction": d}, inputs=full,
                              lens=("init", [5, 2, 3])))
            specs.append(dict(op=op, name=f"{op}_{d}_lens_input_layout1", ndir=nd,
                              attrs={"direction": d}, inputs=full, layout=1,
                              lens=("input", [1, 5, 4])))
        specs.append(dict(op=op, name=f"{op}_clip_noinit", ndir=2,
                          attrs={"direction": "bidirectional", "clip": 0.4},
                          inputs=["W", "R", "B"]))
        specs.append(dict(op=op, name=f"{op}_opset7_nobias", ndir=1, attrs={},
                          inputs=["W", "R"], opset=7))
    specs += [
        dict(op="GRU", name="GRU_linear_before_reset", ndir=2,
             attrs={"direction": "bidirectional", "linear_before_reset": 1}, inputs=full,
             lens=("init", [4, 5, 1])),
        dict(op="LSTM", name="LSTM_input_forget_clip", ndir=1,
             attrs={"input_forget": 1, "clip": 0.5}, inputs=full),
        dict(op="LSTM", name="LSTM_activations", ndir=2,
             attrs={"direction": "bidirectional",
                    "activations": ["HardSigmoid", "LeakyRelu", "Softsign", "Sigmoid", "Elu",
                                    "ScaledTanh"],
                    "activation_alpha": [0.3, 0.2, 0.9, 1.5],
                    "activation_beta": [0.4, 0.7]}, inputs=full),
        dict(op="GRU", name="GRU_activations", ndir=1,
             attrs={"activations": ["Affine", "ThresholdedRelu"],
                    "activation_alpha": [0.5, 0.1], "activation_beta": [0.2]}, inputs=full),
        dict(op="RNN", name="RNN_relu", ndir=1, attrs={"activations": ["Relu"]},
             inputs=full),
    ]
    # each again with a symbolic sequence length: imported as the fused op
    return specs + [dict(sp, name=sp["name"] + "_dynT", dyn=True) for sp in specs]


def check_nodes(np, ort, kiln, out):
    rng = np.random.default_rng(0)
    failed = []
    for spec in node_specs():
        try:
            line, why = node_case(np, ort, kiln, out, rng, spec)
        except RuntimeError as e:
            line, why = "", str(e)
        print(f"onnx_ops {spec['name']}: {'FAIL: ' + why if why else line}")
        if why:
            failed.append(spec["name"])
    return f"{len(failed)} node cases fail: {', '.join(failed)}" if failed else None


def check(np, ort, torch, kiln, out, name):
    if name == "onnx_ops":
        return check_nodes(np, ort, kiln, out)
    if name in DYN_MODELS:
        return check_torch_dyn(np, ort, torch, kiln, out, name)
    if name not in TORCH_MODELS:
        return f"unknown model (one of {', '.join(DEFAULT)})"
    return check_torch(np, ort, torch, kiln, out, name)


if __name__ == "__main__":
    sys.exit(check_models(sys.argv, __doc__, DEFAULT, check))
