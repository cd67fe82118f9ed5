#!/usr/bin/python3
"""time_torch.py: PyTorch's time per training step for the digits CNN that
tests/train/make_digits.py writes (Conv2d(1,8,3,pad 1) - BatchNorm2d - ReLU -
MaxPool2d(2) - Linear(128,10)), to set beside `kiln train`'s ms/step in
docs/TRAINING.md.

One step is what kiln's train step graph computes: forward in train mode,
cross-entropy, backward, SGD (momentum 0.9, Nesterov, weight decay 5e-4)
update, on batches of B shuffled training images.  Prints the median and
minimum over R timed steps after W warm-up steps, with 1 thread (as kiln's
interpreter runs) and with PyTorch's default thread count.

usage: /usr/bin/python3 time_torch.py DATADIR [B=32] [R=300] [W=30]
"""
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        return self.fc(torch.flatten(h, 1))


def time_steps(x, y, batch, runs, warmup):
    torch.manual_seed(0)
    model = CNN().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    rng = np.random.RandomState(0)
    times = []
    for i in range(warmup + runs):
        idx = torch.from_numpy(rng.randint(0, len(y), batch))
        xb, yb = x[idx], y[idx]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times), 1e3 * min(times)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    batch, runs, warmup = (int(a) for a in (sys.argv[2:] + ["32", "300", "30"][len(sys.argv) - 2:])[:3])
    x = torch.from_numpy(np.load(os.path.join(d, "train_img.npy")))
    y = torch.from_numpy(np.load(os.path.join(d, "train_y.npy")))
    default_threads = torch.get_num_threads()
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        med, best = time_steps(x, y, batch, runs, warmup)
        print(f"torch {torch.__version__}, {threads} thread(s), batch {batch}: "
              f"median {med:.3f} ms/step, min {best:.3f} ms/step")


if __name__ == "__main__":
    main()
