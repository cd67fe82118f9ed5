"""rss_loop.py: does a loop of compile / run / free grow the process?  Not a
test (no assertion on memory); run it by hand and read the numbers:

    KILN_LIBRARY=build/libkiln.so .venv/bin/python python/tests/rss_loop.py [ROUNDS]

Each round compiles the test MLP (ONNX bytes), runs it, trains a
TrainStep two steps, takes its state_dict and loads it back, quantizes
the MLP, then frees everything; the resident set size (RSS, from
/proc/self/statm) is printed after rounds 10, 20, ... ."""
import gc
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]
import kiln  # noqa: E402
from conftest import mlp_onnx  # noqa: E402


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def round_trip(data, x, y):
    with kiln.compile(data) as m:
        m(x)
    ts = kiln.TrainStep(data, x, optimizer="adam", lr=0.01)
    for _ in range(2):
        ts.step(x, y)
    ts.load_state_dict(ts.state_dict())
    ts.close()
    kiln.quantize(data, x)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    data, _ = mlp_onnx(hidden=64, fin=32, fout=10)
    rng = np.random.RandomState(0)
    x = rng.randn(16, 32).astype(np.float32)
    y = rng.randint(0, 10, 16).astype(np.int64)
    round_trip(data, x, y)
    print(f"after the first round: {rss_mb():.1f} MB")
    for r in range(1, rounds + 1):
        round_trip(data, x, y)
        gc.collect()
        if r % 10 == 0:
            print(f"after {r} more rounds: {rss_mb():.1f} MB", flush=True)


if __name__ == "__main__":
    main()
