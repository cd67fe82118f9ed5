#!/usr/bin/python3
"""BERT- and GPT-2-style transformer blocks, written with torch.nn the way
HuggingFace's modelling code writes them, exported to ONNX.

    /usr/bin/python3 bench/blocks.py OUT_DIR [--small] [--batches 1,16]

Writes OUT_DIR/{bert,gpt2}_o{13,17}_bB.onnx for each batch B (a fixed batch:
the exported Shape/Gather/Concat/Reshape arithmetic folds then).  At opset
13 torch exports LayerNorm decomposed (ReduceMean, Sub, Pow, ReduceMean,
Add, Sqrt, Div, Mul, Add); at 17 as LayerNormalization.  GELU is the erf
form in BERT (x * 0.5 * (1 + erf(x / sqrt 2))) and the tanh form written
out in GPT-2; GPT-2's causal mask is a constant added before the softmax.

--small builds hidden 64, 4 heads, ffn 256, seq 16 (for tests).  Weights are
random and seeded.
"""
import math
import os
import sys

import torch
from torch import nn

torch.manual_seed(0)


def gelu_erf(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) *
                                       (x + 0.044715 * torch.pow(x, 3.0))))


class Attention(nn.Module):
    def __init__(self, hidden, heads, causal_seq=0):
        super().__init__()
        self.h = heads
        self.d = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        if causal_seq:
            m = torch.tril(torch.ones(causal_seq, causal_seq))
            self.register_buffer("mask", (1.0 - m) * -10000.0)
        else:
            self.mask = None

    def heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.h, self.d).permute(0, 2, 1, 3)

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        if self.mask is not None:
            scores = scores + self.mask
        p = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous().view(b, s, c)
        return self.o(ctx)


class Bert(nn.Module):
    """Post-LayerNorm, erf GELU (HF BertLayer)."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.attn = Attention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.fc2(gelu_erf(self.fc1(x))))


class Gpt2(nn.Module):
    """Pre-LayerNorm, tanh GELU written out, causal mask (HF GPT2Block)."""

    def __init__(self, hidden, heads, ffn, seq):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = Attention(hidden, heads, causal_seq=seq)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(gelu_tanh(self.fc1(self.ln2(x))))


def build(name, small=False):
    torch.manual_seed(0)
    hidden, heads, ffn, seq = (64, 4, 256, 16) if small else (768, 12, 3072, 128)
    m = Bert(hidden, heads, ffn) if name == "bert" else Gpt2(hidden, heads, ffn, seq)
    # LayerNorm weights away from 1/0 so a wrong scale or shift shows
    for mod in m.modules():
        if isinstance(mod, nn.LayerNorm):
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.1, 0.1)
    return m.eval(), (seq, hidden)


def main():
    args = sys.argv[1:]
    out = args[0]
    small = "--small" in args
    batches = (1, 16)
    if "--batches" in args:
        batches = tuple(int(b) for b in args[args.index("--batches") + 1].split(","))
    os.makedirs(out, exist_ok=True)
    for name in ("bert", "gpt2"):
        m, shape = build(name, small)
        for opset in (13, 17):
            for b in batches:
                x = torch.randn(b, *shape)
                path = os.path.join(out, f"{name}_o{opset}_b{b}.onnx")
                torch.onnx.export(m, x, path, opset_version=opset, input_names=["x"],
                                  output_names=["y"], do_constant_folding=True)
                print(path)


if __name__ == "__main__":
    main()
