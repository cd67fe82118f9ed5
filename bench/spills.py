#!/usr/bin/python3
"""Inner loops of a compiled kiln library that keep vector values on the stack.

    /usr/bin/python3 bench/spills.py MODEL.so [--max-insns N] [--all]

Disassembles the library (objdump -d) and, for every backward branch (a
loop), counts the FMAs and the zmm/ymm loads and stores addressed off %rsp
between its target and the branch.  Loops of at most --max-insns (default
220) instructions with such stack accesses are printed: in a GEMM micro-
kernel or a conv's inner loop each one is a spilled accumulator or operand,
reloaded every pass.  This is how the 2x-unrolled direct tiles of
kiln_sgemm were found spilling 10-26 zmm per pass of the k loop
(docs/PERFORMANCE.md, 2026-12-04 afternoon).  --all prints loops without
FMAs too.  Exit status 0 always: a report, not a test.
"""
import argparse
import re
import subprocess
import sys


def loops(path):
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                         text=True, check=True).stdout
    fn, ins = None, {}
    for line in asm.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:", line)
        if m:
            fn = m.group(2)
            ins[fn] = []
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if m and fn:
            ins[fn].append((int(m.group(1), 16), m.group(2)))
    for f, body in ins.items():
        for addr, text in body:
            m = re.match(r"j\w+\s+([0-9a-f]+)", text)
            if not m or int(m.group(1), 16) >= addr:
                continue
            lo = int(m.group(1), 16)
            loop = [t for a, t in body if lo <= a <= addr]
            fma = sum("vfmadd" in t for t in loop)
            stack = sum(("zmm" in t or "ymm" in t) and "(%rsp)" in t for t in loop)
            yield f, lo, addr, len(loop), fma, stack


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib")
    ap.add_argument("--max-insns", type=int, default=220)
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    found = 0
    for f, lo, hi, n, fma, stack in loops(a.lib):
        if stack and n <= a.max_insns and (fma or a.all):
            print(f"{f}: loop {lo:x}-{hi:x}, {n} instructions, {fma} FMAs, "
                  f"{stack} vector stack accesses")
            found += 1
    print(f"{found} loop(s) with vector stack accesses", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
