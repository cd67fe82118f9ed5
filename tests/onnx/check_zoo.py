#!/usr/bin/env python3
"""torchvision models as people export them, through kiln against ONNX Runtime.

    /usr/bin/python3 tests/onnx/check_zoo.py export [--opset N] OUT_DIR [NAME...]
    .venv/bin/python tests/onnx/check_zoo.py check KILN OUT_DIR [NAME...]
    .venv/bin/python tests/onnx/check_zoo.py sweep KILN OUT_DIR [--opset N ...] [NAME...]

`export` (Debian's python3: torch 1.13, torchvision 0.14) writes NAME.onnx
and NAME_x.npy for each model: random seeded weights (nothing is
downloaded; a classifier head that torchvision initialises to zero gets
small random weights, so the outputs compare), eval mode, opset 13 (or
--opset N: PyTorch 1.13 writes up to 17), a
dynamic batch "N", a batch of 2 inputs.  `check` (the venv's python, which
has onnxruntime and, through the system site packages, torch) compiles each with `KILN compile`, runs it with `KILN run`
and compares with ORT on the same input: it prints the compile time and
max |kiln - ORT| / max |ORT|, and fails (exit 1) when a model does not
import, compile or run, or differs by more than 1e-4.  Not a ctest: the
exports take minutes; docs/ONNX.md quotes its output.  `sweep` does
both for one model and opset at a time (13 and 17 unless --opset is
given), deleting each export once checked; with no NAME, every classifier
and segmentation model torchvision has.
"""
import os
import shutil
import subprocess
import sys
import time

CLASSIFIERS = ("mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf",
               "googlenet", "swin_t", "vit_b_16", "resnet50", "squeezenet1_1",
               "shufflenet_v2_x1_0", "densenet121", "inception_v3", "mnasnet1_0",
               "resnext50_32x4d", "regnet_x_400mf", "efficientnet_v2_s", "mobilenet_v3_large",
               "alexnet", "vgg11_bn", "wide_resnet50_2", "maxvit_t", "swin_v2_t")
SEGMENTATION = ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "fcn_resnet50",
                "deeplabv3_resnet50", "deeplabv3_resnet101", "fcn_resnet101")
TOL = 1e-4


def export(out, names, opset=13):
    import numpy as np
    import torch
    import torchvision
    from torch.onnx import register_custom_op_symbolic

    # PyTorch 1.13 has no ONNX symbolic for aten::zero (Tensor.zero_, which
    # Swin V2 applies to a slice of its qkv bias); x * 0 has its value.
    def zero(g, x):
        return g.op("Mul", x, g.op("Constant", value_t=torch.tensor(0, dtype=torch.float32)))

    register_custom_op_symbolic("aten::zero", zero, 9)
    os.makedirs(out, exist_ok=True)
    for name in names:
        torch.manual_seed(0)
        seg = name in SEGMENTATION
        if seg:
            m = getattr(torchvision.models.segmentation, name)(
                weights=None, weights_backbone=None, num_classes=5, aux_loss=False)
            size = 128
        else:
            kw = {"aux_logits": False, "init_weights": True} if name in (
                "googlenet", "inception_v3") else {}
            m = getattr(torchvision.models, name)(weights=None, **kw)
            size = 299 if name == "inception_v3" else 224
        m.eval()
        if name.startswith("vit_"):
            torch.nn.init.normal_(m.heads.head.weight, std=0.02)
        x = torch.randn(1, 3, size, size)
        torch.onnx.export(m, x, os.path.join(out, name + ".onnx"), opset_version=opset,
                          input_names=["input"], output_names=["out"],
                          dynamic_axes={"input": {0: "N"}, "out": {0: "N"}})
        xs = np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32)
        np.save(os.path.join(out, name + "_x.npy"), xs)
        print(f"check_zoo.py: exported {name}", flush=True)
    return 0


def check(kiln, out, names):
    import numpy as np
    import onnxruntime as ort
    failed = 0
    for name in names:
        onnx_path, xp = os.path.join(out, name + ".onnx"), os.path.join(out, name + "_x.npy")
        so, res = os.path.join(out, name + ".so"), os.path.join(out, name + "_out")
        if not os.path.exists(onnx_path):
            print(f"{name}: no export (run the export step)")
            failed += 1
            continue
        x = np.load(xp)
        ref = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(
            None, {"input": x})[0]
        t = time.time()
        r = subprocess.run([kiln, "compile", onnx_path, "-o", so], capture_output=True, text=True)
        secs = time.time() - t
        if r.returncode == 0:
            r = subprocess.run([kiln, "run", so, "-i", f"input={xp}", "-o", res],
                               capture_output=True, text=True)
        if r.returncode:
            print(f"{name}: FAILED: {r.stderr.strip()[:300]}")
            failed += 1
            continue
        got = np.load(os.path.join(res, "out.npy"))
        rel = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
        ok = got.shape == ref.shape and rel <= TOL
        failed += not ok
        print(f"{name}: compiled in {secs:.1f} s, output {got.shape}, max |kiln - ORT| / "
              f"max |ORT| = {rel:.2e}{'' if ok else '  FAIL'}")
    return 1 if failed else 0


def every_model():
    """Every classification and segmentation builder of the installed
    torchvision (0.14: 80 classifiers, 6 segmentation models)."""
    import torchvision
    cls = sorted(n for n in dir(torchvision.models)
                 if n[0].islower() and n not in ("list_models",) and not n.startswith("get_")
                 and callable(getattr(torchvision.models, n)))
    return cls + list(SEGMENTATION)


def sweep(kiln, out, opsets, names):
    """Each model at each opset: export in a child process, check, then
    delete its files, so a sweep over every model needs the disk of the
    largest one only.  A model PyTorch cannot export is reported as such
    (not a kiln failure); the exit status counts kiln's failures."""
    failed = 0
    for name in names:
        for opset in opsets:
            d = os.path.join(out, f"{name}.{opset}")
            os.makedirs(d, exist_ok=True)
            t = time.time()
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "export", "--opset",
                                str(opset), d, name], capture_output=True, text=True)
            exp = time.time() - t
            if r.returncode:
                last = (r.stderr.strip().splitlines() or ["?"])[-1]
                print(f"{name} opset {opset}: PyTorch cannot export it: {last[:200]}", flush=True)
                shutil.rmtree(d, ignore_errors=True)
                continue
            size = os.path.getsize(os.path.join(d, name + ".onnx")) + sum(
                os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                if not f.endswith((".onnx", ".npy")))
            print(f"{name} opset {opset}: exported in {exp:.0f} s, {size / 1e6:.0f} MB; ",
                  end="", flush=True)
            failed += check(kiln, d, [name])
            sys.stdout.flush()
            shutil.rmtree(d, ignore_errors=True)
    print(f"sweep: {len(names)} models x {len(opsets)} opsets, {failed} kiln failures", flush=True)
    return 1 if failed else 0


def main(argv):
    if len(argv) >= 5 and argv[1] == "export" and argv[2] == "--opset":
        return export(argv[4], argv[5:] or CLASSIFIERS + SEGMENTATION, int(argv[3]))
    if len(argv) >= 3 and argv[1] == "export":
        return export(argv[2], argv[3:] or CLASSIFIERS + SEGMENTATION)
    if len(argv) >= 4 and argv[1] == "check":
        return check(argv[2], argv[3], argv[4:] or CLASSIFIERS + SEGMENTATION)
    if len(argv) >= 4 and argv[1] == "sweep":
        opsets, rest = [], argv[4:]
        while len(rest) >= 2 and rest[0] == "--opset":
            opsets.append(int(rest[1]))
            rest = rest[2:]
        return sweep(argv[2], argv[3], opsets or [13, 17], rest or every_model())
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
