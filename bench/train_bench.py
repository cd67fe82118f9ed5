#!/usr/bin/python3
"""train_bench.py: `kiln train` beside PyTorch 1.13 per training step, one
thread, side by side in one run, on the digits MLP and the small CNN of
tests/train/make_digits.py at batch 32.

usage: /usr/bin/python3 bench/train_bench.py [KILN] [--epochs E] [--repeat R]
    KILN: the kiln CLI (default build-rel/kiln, else build/kiln)

For each model it runs, with the same data, batch, epochs, optimizer and
cosine schedule:
  - `kiln train` (compiled step, --threads 1): the ms/step it prints (the
    mean over the run of the step alone: forward, loss, backward, update;
    batch gathering, evaluation and the one compile, cached in a temporary
    KILN_CACHE_DIR, not counted) and its final test accuracy; then `kiln
    bench` of the batch-32 library that run used: the step's median;
  - `kiln train --interp`, the same for the interpreter (with --quick: skipped);
  - PyTorch (torch.set_num_threads(1)): the mean time of zero_grad, forward,
    cross-entropy, backward and optimizer.step over every step of the run
    (what kiln's ms/step means), its median, and its final test accuracy.
      MLP: Linear(64,64)-ReLU-Linear(64,10), AdamW lr 1e-3 (both defaults),
           weight decay 0.01, 10 epochs;
      CNN: Conv2d(1,8,3,pad 1)-BatchNorm2d-ReLU-MaxPool2d(2)-Linear(128,10),
           SGD lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4, 10 epochs.
Each kiln run and each PyTorch run is repeated R times (default 3) and the
best mean is reported (the machine may be shared: compare ratios).  Prints a
Markdown table.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

# the digits CNN as PyTorch module: the one tests/train/time_torch.py times
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "train"))
from time_torch import CNN  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = {
    "mlp": dict(onnx="mlp.onnx", x="train_x.npy", vx="test_x.npy",
                args=["--optimizer", "adamw"], desc="digits MLP 64-64-10, AdamW lr 1e-3"),
    "cnn": dict(onnx="cnn.onnx", x="train_img.npy", vx="test_img.npy",
                args=["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9", "--nesterov",
                      "--weight-decay", "5e-4"],
                desc="small CNN (Conv8-BN-ReLU-MaxPool-FC), SGD Nesterov lr 0.1"),
}


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def run_kiln(kiln, data, cache, name, epochs, interp):
    m = MODELS[name]
    cmd = [kiln, "train", os.path.join(data, m["onnx"]), "--x", os.path.join(data, m["x"]),
           "--y", os.path.join(data, "train_y.npy"), "--val-x", os.path.join(data, m["vx"]),
           "--val-y", os.path.join(data, "test_y.npy"), "--batch", "32", "--epochs",
           str(epochs), "--schedule", "cosine", "--seed", "0", "--threads", "1"] + m["args"]
    if interp:
        cmd.append("--interp")
    env = dict(os.environ, KILN_CACHE_DIR=cache)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    last = re.search(r"^trained (\d+) steps .*, ([0-9.]+) ms/step, val_acc ([0-9.]+)%$", out,
                     re.M)
    if not last:
        sys.exit(f"unexpected kiln train output:\n{out}")
    lib = re.search(r"^train step for batch 32: from the cache, (\S+\.so) ", out, re.M)
    return float(last.group(2)), float(last.group(3)), lib.group(1) if lib else None


def bench_kiln(kiln, lib):
    """kiln bench's median of the batch-32 train step kiln train ran."""
    out = subprocess.run([kiln, "bench", lib, "--threads", "1", "--time", "2", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r'"median_ms": ([0-9.]+)', out).group(1))


def run_torch(data, name, epochs):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = MODELS[name]
    x = torch.from_numpy(np.load(os.path.join(data, m["x"])))
    y = torch.from_numpy(np.load(os.path.join(data, "train_y.npy")))
    vx = torch.from_numpy(np.load(os.path.join(data, m["vx"])))
    vy = torch.from_numpy(np.load(os.path.join(data, "test_y.npy")))
    model = (MLP() if name == "mlp" else CNN()).train()
    if name == "mlp":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                              weight_decay=5e-4)
    nb = (len(y) + 31) // 32
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=nb * epochs)
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for b in range(nb):
            idx = perm[b * 32:(b + 1) * 32]
            xb, yb = x[idx], y[idx]
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            sched.step()
    model.eval()
    with torch.no_grad():
        acc = 100.0 * float((model(vx).argmax(1) == vy).float().mean())
    return 1e3 * statistics.mean(times), 1e3 * statistics.median(times), acc, len(times)


def main():
    args = sys.argv[1:]
    epochs, repeat, quick, kiln = 10, 3, False, None
    i = 0
    while i < len(args):
        if args[i] == "--epochs":
            epochs, i = int(args[i + 1]), i + 2
        elif args[i] == "--repeat":
            repeat, i = int(args[i + 1]), i + 2
        elif args[i] == "--quick":
            quick, i = True, i + 1
        else:
            kiln, i = args[i], i + 1
    if not kiln:
        for b in ("build-rel", "build"):
            if os.path.exists(os.path.join(ROOT, b, "kiln")):
                kiln = os.path.join(ROOT, b, "kiln")
                break
    if not kiln:
        sys.exit("no kiln CLI: pass its path, or build build-rel (cmake -B build-rel "
                 "-DCMAKE_BUILD_TYPE=Release)")
    with tempfile.TemporaryDirectory(prefix="kiln_train_bench.") as tmp:
        data, cache = os.path.join(tmp, "data"), os.path.join(tmp, "cache")
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/train/make_digits.py"),
                        data], check=True, capture_output=True)
        print(f"kiln: {kiln}; torch {torch.__version__}; 1 thread; batch 32; {epochs} epochs; "
              f"best of {repeat}")
        print()
        print("| model | kiln train ms/step (mean; bench median) | kiln --interp ms/step | "
              "PyTorch ms/step (mean; median) | kiln / PyTorch (means; medians) | "
              "test acc kiln, PyTorch |")
        print("|---|---|---|---|---|---|")
        for name in MODELS:
            run_kiln(kiln, data, cache, name, 1, False)  # compiles into the cache
            ks = [run_kiln(kiln, data, cache, name, epochs, False) for _ in range(repeat)]
            k = min(ks)
            kb = min(bench_kiln(kiln, k[2]) for _ in range(repeat))
            ki = "-" if quick else f"{run_kiln(kiln, data, cache, name, epochs, True)[0]:.3f}"
            ts = [run_torch(data, name, epochs) for _ in range(repeat)]
            t = min(ts)
            tmed = min(x[1] for x in ts)
            print(f"| {MODELS[name]['desc']} | {k[0]:.3f}; {kb:.3f} | {ki} | {t[0]:.3f}; "
                  f"{tmed:.3f} | {k[0] / t[0]:.2f}x; {kb / tmed:.2f}x | {k[1]:.2f}%, "
                  f"{t[2]:.2f}% |", flush=True)


if __name__ == "__main__":
    main()
