#!/usr/bin/python3
"""The benchmark models, built and exported to ONNX with PyTorch 1.13.

    /usr/bin/python3 bench/models.py OUT_DIR [--quick]

For each model NAME this writes OUT_DIR/NAME.onnx with the batch axis
dynamic ("N"), except the transformer block, whose exported shape
arithmetic (Shape -> Gather -> Concat -> Reshape) only folds with a fixed
batch: it is written once per benchmarked batch as transformer_bB.onnx.
Weights are random and seeded (nothing is downloaded); BatchNorm statistics
are randomised as a trained model's would be.  bench.py imports build() to
time the very same modules in PyTorch.

--quick writes only the MLP and the small CNN; --only NAME[,NAME...] only
those models.
"""
import os
import sys

BATCHES = (1, 16)
# name: (input shape without the batch, ONNX opset)
SHAPES = {
    "mlp": ((784,), 13),
    "cnn": ((1, 28, 28), 13),
    "resnet18": ((3, 224, 224), 13),
    "mobilenet_v2": ((3, 224, 224), 13),
    "transformer": ((64, 256), 17),
    "squeezenet1_1": ((3, 224, 224), 13),
    "shufflenet_v2_x1_0": ((3, 224, 224), 13),
}
QUICK = ("mlp", "cnn")


def randomise_bn(torch, model):
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.1, 0.1)


def build(torch, name):
    """The eval-mode module for a model name, seeded."""
    import torchvision
    nn = torch.nn
    torch.manual_seed(0)
    if name == "mlp":
        m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    elif name == "cnn":  # examples/models.h's example_cnn
        m = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 7 * 7, 10))
    elif name == "resnet18":
        m = torchvision.models.resnet18(weights=None)
    elif name == "mobilenet_v2":
        m = torchvision.models.mobilenet_v2(weights=None)
    elif name == "squeezenet1_1":  # Fire modules: 1x1 squeeze, 1x1 + 3x3 expand, Concat
        m = torchvision.models.squeezenet1_1(weights=None)
    elif name == "shufflenet_v2_x1_0":  # channel split / shuffle: Slice, Reshape, Transpose
        m = torchvision.models.shufflenet_v2_x1_0(weights=None)
    elif name == "transformer":
        m = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                       batch_first=True)
    else:
        raise KeyError(name)
    randomise_bn(torch, m)
    return m.eval()


def onnx_name(name, batch):
    return f"transformer_b{batch}.onnx" if name == "transformer" else f"{name}.onnx"


def export(torch, out, name):
    shape, opset = SHAPES[name]
    m = build(torch, name)
    batches = BATCHES if name == "transformer" else (2,)
    for b in batches:
        x = torch.randn(b, *shape)
        path = os.path.join(out, onnx_name(name, b))
        axes = None if name == "transformer" else {"input": {0: "N"}, "output": {0: "N"}}
        # grad enabled: TransformerEncoderLayer then takes its plain path,
        # made of ops ONNX has, not the fused inference kernel
        torch.onnx.export(m, (x,), path, opset_version=opset, input_names=["input"],
                          output_names=["output"], dynamic_axes=axes,
                          do_constant_folding=True)
        print(f"bench/models.py: {path}")


def selected(argv):
    """The model names argv asks for: --only A,B (also --only=A,B), --quick,
    else all, in SHAPES order; KeyError for an unknown name."""
    only = None
    for i, a in enumerate(argv):
        if a == "--only" and i + 1 < len(argv):
            only = argv[i + 1]
        elif a.startswith("--only="):
            only = a[len("--only="):]
    if only is None:
        return QUICK if "--quick" in argv else tuple(SHAPES)
    names = [n for n in only.split(",") if n]
    for n in names:
        if n not in SHAPES:
            raise KeyError(f"unknown model {n!r} (known: {', '.join(SHAPES)})")
    return tuple(n for n in SHAPES if n in names)


def main(argv):
    args = [a for i, a in enumerate(argv) if i > 0 and not a.startswith("--")
            and argv[i - 1] != "--only"]
    if len(args) != 1:
        sys.stderr.write(__doc__)
        return 2
    import torch
    os.makedirs(args[0], exist_ok=True)
    for name in selected(argv):
        export(torch, args[0], name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
