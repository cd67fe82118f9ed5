#!/bin/sh
# distributed.sh: throughput of `kiln train --distributed` (docs/DISTRIBUTED.md,
# "Scaling measured here"): the digits Conv-BN CNN at a global batch of 64,
# 1 rank x 1 thread against 2 ranks x 1 thread, alternated three times; the
# time per epoch is (T(41 epochs) - T(1 epoch)) / 40 of the whole command.
# usage: bench/distributed.sh KILN WORKDIR [--sync-bn]   (needs mpirun, sklearn)
set -eu
K=$1
W=$2
SYNC=${3:-}
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$W"
cd "$W"
[ -f data/cnn.onnx ] || /usr/bin/python3 "$SRC/tests/train/make_digits.py" data > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 KILN_CACHE_DIR=$W/cache
C="data/cnn.onnx --x data/train_img.npy --y data/train_y.npy --optimizer sgd --lr 0.1
   --momentum 0.9 --batch 64 --seed 1 --threads 1 --quiet"
t() {
	a=$(date +%s.%N)
	"$@" > /dev/null 2>&1
	b=$(date +%s.%N)
	echo "$b - $a" | bc
}
# compile (or load) both steps once, outside the timings
"$K" train $C --epochs 1 > /dev/null 2>&1
mpirun -np 2 "$K" train $C --distributed $SYNC --epochs 1 > /dev/null 2>&1
for i in 1 2 3; do
	a1=$(t "$K" train $C --epochs 1)
	a41=$(t "$K" train $C --epochs 41)
	b1=$(t mpirun -np 2 "$K" train $C --distributed $SYNC --epochs 1)
	b41=$(t mpirun -np 2 "$K" train $C --distributed $SYNC --epochs 41)
	echo "$a1 $a41 $b1 $b41" | awk '{ea = ($2 - $1) / 40; eb = ($4 - $3) / 40
		printf "round %d: 1 rank x 1 thread %.1f ms/epoch (%.0f samples/s) | 2 ranks x 1 thread %.1f ms/epoch (%.0f samples/s) | %.2fx\n", '"$i"', 1e3 * ea, 1438 / ea, 1e3 * eb, 1438 / eb, ea / eb}'
done
cat /proc/loadavg
