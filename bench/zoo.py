#!/usr/bin/python3
"""Held-out models: torchvision classifiers that bench/ does not time,
exported like the bench models, so kiln's speed can be checked on models
nobody tuned it for (issue #10's geometric-mean criterion).

    /usr/bin/python3 bench/zoo.py OUT_DIR [NAME ...]
    .venv/bin/python bench/cpu_time.py --kiln build-bench/kiln OUT_DIR/*.onnx

Each NAME.onnx: random seeded weights (nothing is downloaded), BatchNorm
statistics randomised as a trained model's would be (bench/models.py),
eval mode, a dynamic batch "N", opset 13, input 3x224x224.  A model whose
export fails is reported and skipped.
"""
import os
import sys

NAMES = ("resnet34", "resnet50", "resnext50_32x4d", "densenet121", "googlenet", "vgg11",
         "regnet_y_400mf", "regnet_x_800mf", "mnasnet1_0", "efficientnet_b0",
         "mobilenet_v3_large", "mobilenet_v3_small", "shufflenet_v2_x0_5")


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    import torch
    import torchvision
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from models import randomise_bn
    out, names = argv[1], argv[2:] or NAMES
    os.makedirs(out, exist_ok=True)
    for name in names:
        torch.manual_seed(0)
        try:
            kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
            m = getattr(torchvision.models, name)(weights=None, **kw).eval()
            randomise_bn(torch, m)
            path = os.path.join(out, name + ".onnx")
            torch.onnx.export(m, (torch.randn(2, 3, 224, 224),), path, opset_version=13,
                              input_names=["input"], output_names=["output"],
                              dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
                              do_constant_folding=True)
            print(f"bench/zoo.py: {path}", flush=True)
        except Exception as e:  # an export PyTorch cannot do: say so, go on
            print(f"bench/zoo.py: {name}: export failed: {e}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
