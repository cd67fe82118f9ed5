#!/bin/sh
# time_step.sh: the compiled CNN train step (kiln_compile_train, typed entry
# point, one thread) beside PyTorch 1.13's eager step on the same model and
# batch, same machine.  Usage: tests/train/time_step.sh [BUILD_DIR] [STEPS]
# (BUILD_DIR default build; any build works, the step itself runs in the
# generated library, which is never sanitized).  Results go in
# docs/TRAINING.md.
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
STEPS=${2:-500}
OUT=$(mktemp -d /tmp/kiln_time_step.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
SAN=""
grep -q 'KILN_SANITIZE:BOOL=ON' "$BUILD/CMakeCache.txt" && SAN="-fsanitize=address,undefined"
cc -O2 $SAN -I"$SRC/include" -o "$OUT/time_step" "$SRC/tests/train/time_step.c" \
	"$BUILD/libkiln.a" "$BUILD/libkilnrt.a" -L/usr/lib/llvm-14/lib -Wl,-rpath,/usr/lib/llvm-14/lib \
	-lLLVM-14 -lprotobuf-c -ldl -lm -lpthread
export KILN_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0
for B in 16 128; do
	"$OUT/time_step" "$OUT" "$B" "$STEPS"
	/usr/bin/python3 "$SRC/tests/train/time_step.py" "$B" "$STEPS"
done
