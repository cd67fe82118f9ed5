#!/usr/bin/python3
"""PyTorch's train step for the parity CNN (tests/fixtures/make_train_fixtures.py's
CNN: conv1, bn1 in train mode, ReLU, MaxPool2d(2), fc), SGD(momentum 0.9,
weight_decay 5e-4), one thread.  Usage: time_step.py BATCH STEPS; prints
"torch B=<batch> median_ms=<m> p10_ms=<a> p90_ms=<b>" (time_step.sh runs it)."""
import sys
import time

import torch
from torch import nn


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        return self.fc(torch.flatten(x, 1))


def main():
    batch, steps = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = CNN().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    lossf = nn.CrossEntropyLoss()
    x = torch.rand(batch, 1, 8, 8)
    y = torch.arange(batch) % 10

    def step():
        opt.zero_grad()
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(20):
        step()
    ms = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        ms.append(1e3 * (time.perf_counter() - t))
    ms.sort()
    print(f"torch B={batch} median_ms={ms[steps // 2]:.4f} p10_ms={ms[steps // 10]:.4f} "
          f"p90_ms={ms[steps * 9 // 10]:.4f}")


if __name__ == "__main__":
    main()
