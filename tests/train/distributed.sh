#!/bin/sh
# distributed.sh: `kiln train --distributed` under mpirun (docs/DISTRIBUTED.md).
#
#   1. loss parity: the digits MLP, and the Conv-BN CNN with --sync-bn,
#      trained by one process and by 2 and 4 ranks (4 oversubscribed on 2
#      cores) with the same global batch and the same sample order give the
#      same per-step losses: f64 within 1e-12 relative, f32 within 1e-5
#      (only the sums' order differs); without --sync-bn the CNN's do not;
#   2. the DistributedSampler's rules: 1438 samples on 4 ranks pad to 1440
#      (45 global batches of 32) or, with --drop-last, cut to 1436;
#   3. the Conv-BN CNN trains on 2 ranks (per-rank BatchNorm statistics,
#      DDP's default) to >= 90% test accuracy;
#   4. checkpoints: rank 0 writes them; a run stopped at step 60 resumes from
#      its step-40 checkpoint on 2 ranks (the uninterrupted curve exactly)
#      and on 1 rank (within 1e-5);
#   5. faults: a rank killed mid-run ends the job naming it, and that run's
#      last checkpoint resumes on 2 ranks and on 1 (the same losses within
#      1e-5); a rank that hangs (SIGSTOP) fails the others within
#      --comm-timeout naming it; a rank with other options is found before
#      training.
#
# usage: distributed.sh KILN WORKDIR MPIRUN
# Exit 77 (skip) without mpirun or Debian's python3-sklearn.
set -eu

KILN=$1
W=$2
MPIRUN=$3
SRC=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v "$MPIRUN" > /dev/null 2>&1; then
	echo "skipped: no mpirun (install openmpi-bin: scripts/install-deps.sh)"
	exit 77
fi
if ! /usr/bin/python3 -c "import sklearn, onnx" 2>/dev/null; then
	echo "skipped: /usr/bin/python3 lacks sklearn or onnx"
	exit 77
fi
rm -rf "$W"
mkdir -p "$W"
cd "$W"
KILN_CACHE_DIR=$W/cache
# CI runs as root; --oversubscribe lets 4 ranks share 2 cores
OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export KILN_CACHE_DIR OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
# Under ASan, ranks run without LeakSanitizer: Open MPI 4.1's plugins leak
# and are unloaded by MPI_Finalize, so their frames name no module and no
# suppression can match them (only Open MPI's frames appeared, checked by
# hand).  One-process runs here, and the split step in test_compiled_train,
# stay leak-checked.
MPIRUN="env ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 $MPIRUN"
MPI="$MPIRUN --oversubscribe"

die() {
	echo "FAIL: $*"
	exit 1
}

/usr/bin/python3 "$SRC/tests/train/make_digits.py" data > /dev/null
# 1280 samples: 40 global batches of 32 whether 1, 2 or 4 ranks share them;
# the f64 MLP is the f32 one with every tensor widened
/usr/bin/python3 - << 'EOF'
import numpy as np, onnx
from onnx import numpy_helper, TensorProto
x, y = np.load("data/train_x.npy"), np.load("data/train_y.npy")
img = np.load("data/train_img.npy")
np.save("data/sx.npy", x[:1280]); np.save("data/sy.npy", y[:1280])
np.save("data/sx64.npy", x[:1280].astype(np.float64))
np.save("data/simg.npy", img[:1280]); np.save("data/simg64.npy", img[:1280].astype(np.float64))
for name in ("mlp", "cnn"):
    m = onnx.load(f"data/{name}.onnx")
    for i, t in enumerate(m.graph.initializer):
        a = numpy_helper.to_array(t).astype(np.float64)
        m.graph.initializer[i].CopyFrom(numpy_helper.from_array(a, t.name))
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    onnx.save(m, f"data/{name}64.onnx")
EOF

# same_losses TOL FROM A.csv B.csv: rows from step FROM on agree in number
# and every loss within TOL relative
same_losses() {
	/usr/bin/python3 - "$@" << 'EOF'
import csv, sys
tol, first = float(sys.argv[1]), int(sys.argv[2])
a, b = ([r for r in csv.DictReader(open(p)) if int(r["step"]) >= first] for p in sys.argv[3:5])
assert len(a) == len(b) and len(a) > 0, (sys.argv[3:5], len(a), len(b))
worst = 0.0
for r, s in zip(a, b):
    assert r["step"] == s["step"], (r["step"], s["step"])
    la, lb = float(r["loss"]), float(s["loss"])
    rel = abs(la - lb) / abs(la)
    worst = max(worst, rel)
    if rel > tol:
        sys.exit(f"FAIL: {sys.argv[4]} step {r['step']}: loss {lb!r} vs {la!r} in "
                 f"{sys.argv[3]} (relative {rel:.3g} > {tol:g})")
print(f"{sys.argv[4]} vs {sys.argv[3]}: {len(a)} steps, worst relative {worst:.3g} (<= {tol:g})")
EOF
}

# ---- 1. loss parity: MLP, and CNN with --sync-bn; f32 and f64 ----
for t in 32 64; do
	if [ $t = 32 ]; then S="" TOL=1e-5; else S=64 TOL=1e-12; fi
	for net in mlp cnn; do
		if [ $net = mlp ]; then X=data/sx$S.npy SYNC=""; else X=data/simg$S.npy SYNC=--sync-bn; fi
		A="data/$net$S.onnx --x $X --y data/sy.npy --optimizer sgd --lr 0.1 --momentum 0.9
		   --weight-decay 1e-4 --epochs 2 --batch 32 --seed 3 --threads 1 --quiet"
		"$KILN" train $A --log $net-one$t.csv 2> /dev/null
		for k in 2 4; do
			$MPI -np $k "$KILN" train $A --distributed $SYNC --log $net-np$k-$t.csv
			same_losses $TOL 1 $net-one$t.csv $net-np$k-$t.csv
		done
	done
done
# per-rank BatchNorm statistics (no --sync-bn) are not the global batch's
$MPI -np 2 "$KILN" train data/cnn.onnx --x data/simg.npy --y data/sy.npy --optimizer sgd \
	--lr 0.1 --momentum 0.9 --weight-decay 1e-4 --epochs 2 --batch 32 --seed 3 --threads 1 \
	--quiet --distributed --log cnn-perrank.csv
if same_losses 1e-3 1 cnn-one32.csv cnn-perrank.csv > /dev/null 2>&1; then
	die "per-rank BatchNorm on 2 ranks should not match one process"
fi

# ---- 2. the sampler: 1438 samples on 4 ranks ----
$MPI -np 4 "$KILN" train data/mlp.onnx --x data/train_x.npy --y data/train_y.npy --batch 32 \
	--threads 1 --quiet --distributed --log pad.csv
$MPI -np 4 "$KILN" train data/mlp.onnx --x data/train_x.npy --y data/train_y.npy --batch 32 \
	--threads 1 --quiet --distributed --drop-last --log drop.csv
[ "$(tail -n 1 pad.csv | cut -d, -f1)" = 45 ] || die "padded: $(tail -n 1 pad.csv), want 45 steps"
[ "$(tail -n 1 drop.csv | cut -d, -f1)" = 45 ] || die "drop-last: $(tail -n 1 drop.csv)"
/usr/bin/python3 - << 'EOF'
# drop-last's last global batch is 1436 - 44 * 32 = 28 rows, padding's 32:
# their epoch losses differ while every earlier step is the same batch
import csv
p, d = (list(csv.DictReader(open(f))) for f in ("pad.csv", "drop.csv"))
assert [r["loss"] for r in p[:44]] == [r["loss"] for r in d[:44]], "first 44 steps differ"
assert p[44]["loss"] != d[44]["loss"], "the last batch should differ"
print("sampler: 45 steps padded and dropped, the same first 44")
EOF

# ---- 3. the Conv-BN CNN on 2 ranks ----
CNN="data/cnn.onnx --x data/train_img.npy --y data/train_y.npy --val-x data/test_img.npy
     --val-y data/test_y.npy --optimizer sgd --lr 0.1 --momentum 0.9 --epochs 2 --batch 32
     --seed 1 --threads 1"
$MPI -np 2 "$KILN" train $CNN --distributed > cnn.log
cat cnn.log
acc=$(sed -n 's/^trained .*val_acc \([0-9.]*\)%$/\1/p' cnn.log)
awk -v a="$acc" 'BEGIN { exit !(a >= 90) }' || die "CNN on 2 ranks: val_acc '$acc' < 90%"

# ---- 4. checkpoints: rank 0 writes them, 1 or 2 ranks resume ----
R="data/mlp.onnx --x data/sx.npy --y data/sy.npy --optimizer adamw --lr 0.01 --epochs 3
   --batch 32 --seed 5 --threads 1 --quiet"
$MPI -np 2 "$KILN" train $R --distributed --log full.csv
$MPI -np 2 "$KILN" train $R --distributed --checkpoint ck --every 40 --stop-after 60 2> /dev/null
[ "$(ls ck)" = "ckpt-000000040.safetensors" ] || die "ck: $(ls ck)"
$MPI -np 2 "$KILN" train $R --distributed --resume ck --log res2.csv
"$KILN" train $R --resume ck --log res1.csv
same_losses 0 41 full.csv res2.csv
same_losses 1e-5 41 full.csv res1.csv

# ---- 5. faults ----
# rank_pid RANK: the pid of that rank of the running job
rank_pid() {
	for p in $(pgrep -f "kiln train data/mlp.onnx"); do
		if tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
			echo $p
			return
		fi
	done
}
LONG="$R --epochs 100000 --distributed --comm-timeout 5"
for fault in KILL STOP; do
	CK=""
	[ $fault = KILL ] && CK="--checkpoint ckk --every 40"
	$MPI -np 2 "$KILN" train $LONG $CK > $fault.out 2>&1 &
	job=$!
	p=""
	for i in $(seq 100); do
		p=$(rank_pid 1)
		[ -n "$p" ] && break
		sleep 0.1
	done
	[ -n "$p" ] || die "$fault: no rank 1 found"
	sleep 2
	kill -$fault "$p"
	t0=$(date +%s)
	set +e
	wait $job
	rc=$?
	set -e
	t=$(($(date +%s) - t0))
	kill -KILL "$p" 2> /dev/null || true
	[ $rc != 0 ] || die "$fault: the job exited 0"
	# mpirun's own timeout would be far longer; the comm's is 5 s
	[ $t -le 60 ] || die "$fault: the job took ${t}s to end"
	if [ $fault = KILL ]; then
		grep -q "process rank 1 .* exited on signal 9" KILL.out || { cat KILL.out; die "kill"; }
	else
		grep -q "rank 0 of 2: .* of step [0-9]* did not finish within 5 s: no word from rank 1 (dead or hung)" STOP.out ||
			{ cat STOP.out; die "hang: no message naming rank 1"; }
	fi
	echo "$fault of rank 1: the job ended (rc $rc), naming rank 1"
done
# the killed run's last checkpoint resumes on 2 ranks and on 1 (5 steps each)
last=$(ls ckk | tail -n 1)
n=$(echo "$last" | sed 's/^ckpt-0*\([0-9][0-9]*\)\.safetensors$/\1/')
[ -n "$n" ] || die "no checkpoint from the killed run: $(ls ckk)"
$MPI -np 2 "$KILN" train $R --epochs 100000 --distributed --resume ckk --stop-after $((n + 5)) \
	--log kres2.csv 2> /dev/null
"$KILN" train $R --epochs 100000 --resume ckk --stop-after $((n + 5)) --log kres1.csv 2> /dev/null
[ "$(($(wc -l < kres2.csv) - 1))" = 5 ] || die "resumed on 2 ranks: $(cat kres2.csv)"
same_losses 1e-5 $((n + 1)) kres2.csv kres1.csv
echo "the killed run resumed from $last on 2 ranks and on 1"
set +e
$MPIRUN --oversubscribe -np 1 "$KILN" train $R --distributed : -np 1 "$KILN" train $R --lr 0.02 \
	--distributed > mismatch.out 2>&1
rc=$?
set -e
[ $rc != 0 ] && grep -q "rank 1 has a different model or options than rank 0" mismatch.out ||
	{ cat mismatch.out; die "mismatch not found"; }
echo "mismatch: found before training"
echo "distributed: all checks passed"
