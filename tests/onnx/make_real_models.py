#!/usr/bin/python3
"""Exports real PyTorch models to ONNX for kiln's real-model tests.

Writes, into OUT_DIR, for each model NAME: NAME.onnx (PyTorch 1.13's
exporter, batch axis dynamic as "N" except for *_static), NAME_input.npy and NAME_output.npy
(PyTorch's eval-mode output for that input).  Nothing is downloaded: the
torchvision classifiers are randomly initialised (weights=None), all seeded,
so every run writes the same files.  BatchNorm running statistics are
randomised too, so that folding them wrongly would show in the outputs.

    /usr/bin/python3 tests/onnx/make_real_models.py OUT_DIR

The files are large and not committed; OUT_DIR/stamp records the script's
hash, and a run whose stamp matches does nothing (the exports are slow).
Exits 77 (ctest's skip code) when torch or torchvision is missing.
"""
import hashlib
import os
import sys

# transformer_static is the same block with a fixed batch: its shape
# arithmetic (Shape -> Gather -> Concat -> Reshape) folds to constants
# without symbolic dims.
# bert_o13, gpt2_o13 and gpt2_o17 are bench/blocks.py's BERT- and GPT-2-style
# blocks (hidden 64, 4 heads, FFN 256, sequence 16; batch fixed at 2),
# exported at opset 13 (LayerNorm decomposed) or 17: the nnfuse pass
# rewrites their LayerNorms and GELUs when they are compiled.
MODELS = ("resnet18", "mobilenet_v2", "transformer", "transformer_static",
          "bert_o13", "gpt2_o13", "gpt2_o17")


def stamp_text():
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest() + "\n"


def up_to_date(out):
    try:
        with open(os.path.join(out, "stamp")) as f:
            if f.read() != stamp_text():
                return False
    except OSError:
        return False
    return all(os.path.exists(os.path.join(out, f"{m}_output.npy")) for m in MODELS)


def randomise_bn(torch, model):
    """Non-trivial running statistics, as a trained model has."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.1, 0.1)


def build(torch, torchvision, name):
    """(model, example input, opset) for one model, seeded."""
    torch.manual_seed(0)
    if name[:5] in ("bert_", "gpt2_"):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "bench"))
        import blocks
        m, shape = blocks.build(name[:4], small=True)
        torch.manual_seed(1)
        return m, torch.randn(2, *shape), int(name[-2:])
    if name == "resnet18":
        m = torchvision.models.resnet18(weights=None)
        randomise_bn(torch, m)
        return m, torch.randn(2, 3, 64, 64), 13
    if name == "mobilenet_v2":
        m = torchvision.models.mobilenet_v2(weights=None)
        randomise_bn(torch, m)
        return m, torch.randn(2, 3, 64, 64), 17
    m = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                         batch_first=True)
    return m, torch.randn(2, 10, 64), 17


def dynamic_axes(name):
    if name.endswith("_static") or name[:5] in ("bert_", "gpt2_"):
        return None
    return {"input": {0: "N"}, "output": {0: "N"}}


def export(torch, torchvision, np, out, name):
    model, x, opset = build(torch, torchvision, name.replace("_static", ""))
    model.eval()
    # Grad stays enabled, for the reference as for the export: with it,
    # nn.TransformerEncoderLayer takes its plain path (ops ONNX has), not the
    # fused inference kernel.
    y = model(x).detach()
    path = os.path.join(out, f"{name}.onnx")
    torch.onnx.export(model, (x,), path, opset_version=opset,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes=dynamic_axes(name),
                      do_constant_folding=True)
    np.save(os.path.join(out, f"{name}_input.npy"), x.numpy().astype(np.float32))
    np.save(os.path.join(out, f"{name}_output.npy"), y.numpy().astype(np.float32))
    print(f"{name}: opset {opset}, input {tuple(x.shape)} -> output {tuple(y.shape)}")


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    out = argv[1]
    if up_to_date(out):
        print(f"real models in {out} are up to date")
        return 0
    try:
        import numpy as np
        import torch
        import torchvision
    except ImportError as e:
        print(f"skipped: {e} (run with Debian's /usr/bin/python3)")
        return 77
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(2)
    for name in MODELS:
        export(torch, torchvision, np, out, name)
    with open(os.path.join(out, "stamp"), "w") as f:
        f.write(stamp_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
