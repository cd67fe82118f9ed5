#!/bin/sh
# digits.sh: the acceptance runs of `kiln train` on sklearn's digits.
#
#   1. an MLP and a Conv-BN CNN reach >= 95% test accuracy, and each exports
#      an ONNX model plus kiln's test-set logits (checked against ONNX
#      Runtime by check_ort.py, a separate ctest entry);
#   2. a CNN run stopped at step 50 (--stop-after, as a kill would) whose
#      newest checkpoint is then truncated (a torn write): --resume refuses
#      the torn and a bit-flipped checkpoint with a clear message, resuming
#      from the previous one reproduces the uninterrupted run's CSV (every
#      loss to 17 digits) and its final checkpoint byte for byte;
#   3. an MLP run really killed (SIGKILL) once it has checkpointed, then
#      resumed from its checkpoint folder: the same CSV again;
#   4. the .kir path (export, then train from it) and the command-line
#      errors (one "kiln: error:" line, exit 2 for usage, 1 for failures);
#   1b. the trained CNN quantized by `kiln quantize` on 100 training samples
#      loses at most 0.5 points of test accuracy compiled, `kiln compile
#      --int8` gives the same library's logits, and its errors (the QDQ
#      file and kiln's int8 logits go to check_ort.py --int8).
#
# usage: digits.sh KILN WORKDIR    (KILN: the kiln CLI; WORKDIR is recreated)
# Exit 77 (skip) when Debian's python3-sklearn is missing.
set -eu

KILN=$1
W=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
if ! /usr/bin/python3 -c "import sklearn, onnx" 2>/dev/null; then
	echo "skipped: /usr/bin/python3 lacks sklearn or onnx (apt install python3-sklearn python3-onnx)"
	exit 77
fi
rm -rf "$W"
mkdir -p "$W"
cd "$W"
# the compiled train steps go to this run's folder: the first run of each
# model compiles, the later ones (stop, resume) load them from there
KILN_CACHE_DIR=$W/cache
export KILN_CACHE_DIR
/usr/bin/python3 "$SRC/tests/train/make_digits.py" data

die() {
	echo "FAIL: $*"
	exit 1
}

# expect RC PATTERN CMD...: CMD exits with RC and prints PATTERN in one error line
expect() {
	rc=$1 pat=$2
	shift 2
	set +e
	"$@" > out.txt 2> err.txt
	got=$?
	set -e
	[ "$got" -eq "$rc" ] || { cat err.txt; die "'$*' exited $got, expected $rc"; }
	grep -q -- "$pat" err.txt || { cat err.txt; die "'$*': no '$pat' in stderr"; }
	[ "$(grep -c '^kiln: error: ' err.txt)" -eq 1 ] || { cat err.txt; die "'$*': not one error line"; }
}

# at_least PCT LOG: the final val_acc printed in LOG is >= PCT
at_least() {
	acc=$(sed -n 's/^trained .*val_acc \([0-9.]*\)%$/\1/p' "$2")
	[ -n "$acc" ] || die "no final val_acc in $2"
	awk -v a="$acc" -v m="$1" 'BEGIN { exit !(a >= m) }' || die "$2: val_acc $acc% < $1%"
	echo "$2: test accuracy $acc%"
}

# the subcommand must exist (tools/kiln.c dispatches it)
expect 2 "missing MODEL" "$KILN" train

D=data
MLP="$D/mlp.onnx --x $D/train_x.npy --y $D/train_y.npy --val-x $D/test_x.npy --val-y $D/test_y.npy
     --optimizer adamw --lr 0.01 --schedule cosine --epochs 6 --batch 32 --seed 1"
CNN="$D/cnn.onnx --x $D/train_img.npy --y $D/train_y.npy --val-x $D/test_img.npy --val-y $D/test_y.npy
     --optimizer sgd --lr 0.1 --momentum 0.9 --nesterov --weight-decay 5e-4 --schedule cosine
     --epochs 2 --batch 32 --seed 1 --every 20"

# ---- 1. accuracy and export ----
"$KILN" train $MLP --log mlp.csv --export mlp.onnx --val-out mlp_out.npy > mlp.log
cat mlp.log
at_least 95 mlp.log
"$KILN" train $CNN --checkpoint ck_cnn --log cnn.csv --plot cnn.svg --export cnn.onnx \
	--val-out cnn_out.npy > cnn.log
cat cnn.log
at_least 95 cnn.log
# --plot: one panel per series; the raw loss line has a point per step (the
# CSV's rows) at the CSV's values, the accuracy a point per epoch
/usr/bin/python3 - cnn.svg cnn.csv << 'EOF'
import csv, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
titles = [t.text for t in root.iter(ns + "text") if t.get("font-weight") == "bold"]
assert titles == ["training loss", "validation accuracy", "learning rate"], titles
rows = list(csv.DictReader(open(sys.argv[2])))
lines = [p.get("points").split() for p in root.iter(ns + "polyline")]
raw = lines[0]
assert len(raw) == len(rows), (len(raw), len(rows))
ys = [float(p.split(",")[1]) for p in raw]
loss = [float(r["loss"]) for r in rows]
# screen y falls as the loss grows: the highest loss is the topmost point
assert ys.index(min(ys)) == loss.index(max(loss)), "loss line does not follow the CSV"
acc = [r for r in rows if r["val_acc"]]
dots = [c for c in root.iter(ns + "circle")]
assert len(dots) == len(acc) == 2, (len(dots), len(acc))
print(f"cnn.svg: {len(raw)} loss points, {len(dots)} accuracy points")
EOF
[ "$(ls ck_cnn)" = "ckpt-000000080.safetensors
ckpt-000000090.safetensors" ] || die "ck_cnn should keep the last two checkpoints: $(ls ck_cnn)"

# ---- 1b. int8: the trained CNN quantized on 100 training samples ----
"$KILN" quantize cnn.onnx --calib "$D/train_img.npy" --samples 100 -o cnn.int8.onnx > quant.log
cat quant.log
grep -q "^calibrated on 100 samples (minmax): 3 layers, 2 with u8 results" quant.log ||
	die "quantize: unexpected report"
"$KILN" compile cnn.onnx -o cnn_f32.so
"$KILN" compile cnn.int8.onnx -o cnn_int8.so
"$KILN" compile cnn.onnx --int8 --calib x="$D/train_img.npy" --samples 100 -o cnn_int8b.so
for m in f32 int8 int8b; do
	"$KILN" run cnn_$m.so -i x="$D/test_img.npy" -o out_$m > /dev/null
done
cmp out_int8/logits.npy out_int8b/logits.npy || die "compile --int8 differs from quantize + compile"
/usr/bin/python3 - "$D/test_y.npy" out_f32/logits.npy out_int8/logits.npy << 'EOF'
import sys
import numpy as np
y, f, q = (np.load(p) for p in sys.argv[1:])
af, aq = (100 * float(np.mean(o.argmax(1) == y)) for o in (f, q))
print(f"int8: test accuracy f32 {af:.2f}%, int8 {aq:.2f}% ({aq - af:+.2f} points)")
sys.exit(0 if af >= 95 and aq >= af - 0.5 else "FAIL: int8 loses more than 0.5 points")
EOF
cp out_int8/logits.npy cnn_int8_out.npy
expect 2 "missing --calib X.npy" "$KILN" quantize cnn.onnx -o x.onnx
expect 2 "bad value 'kl' for --method" "$KILN" quantize cnn.onnx --calib a.npy --method kl -o x.onnx
expect 2 "calibration options need --int8" "$KILN" compile cnn.onnx --calib a.npy -o x.so
expect 1 "the model has no input 'y'" "$KILN" quantize cnn.onnx --calib y="$D/train_img.npy" -o x.onnx
expect 1 "is f32\[1438,64\]: it must be samples of f32\[N,1,8,8\]" \
	"$KILN" quantize cnn.onnx --calib "$D/train_x.npy" -o x.onnx
expect 1 "is quantized already" "$KILN" quantize cnn.int8.onnx --calib "$D/train_img.npy" -o x.onnx

# ---- 2. stop, torn checkpoint, resume ----
"$KILN" train $CNN --checkpoint ck_stop --log stop.csv --stop-after 50 --quiet
[ "$(tail -n 1 stop.csv | cut -d, -f1)" = 50 ] || die "stop.csv should end at step 50"
cp ck_stop/ckpt-000000040.safetensors flipped.safetensors
head -c 2000 ck_stop/ckpt-000000040.safetensors > torn
mv torn ck_stop/ckpt-000000040.safetensors
expect 1 "checkpoint refused" "$KILN" train $CNN --checkpoint ck_stop --log stop.csv --resume ck_stop
printf '\125' | dd of=flipped.safetensors bs=1 seek=3000 conv=notrunc 2> /dev/null
expect 1 "checksum mismatch, the file is corrupt" "$KILN" train $CNN --checkpoint ck_x --resume flipped.safetensors
expect 1 "made with --batch 32, this run has 64" "$KILN" train $CNN --checkpoint ck_x --batch 64 \
	--resume ck_stop/ckpt-000000020.safetensors
"$KILN" train $CNN --checkpoint ck_stop --log stop.csv --plot stop.svg \
	--resume ck_stop/ckpt-000000020.safetensors > resumed.log
cat resumed.log
grep -q "resumed from ck_stop/ckpt-000000020.safetensors at step 20" resumed.log || die "no resume line"
cmp cnn.csv stop.csv || die "the resumed CNN's curve differs from the uninterrupted run's"
cmp cnn.svg stop.svg || die "the resumed CNN's --plot (steps read back from --log) differs"
cmp ck_cnn/ckpt-000000090.safetensors ck_stop/ckpt-000000090.safetensors ||
	die "the resumed CNN's final checkpoint differs"
echo "CNN stopped at 50, torn checkpoint refused, resumed from 20: identical curve and state"

# ---- 3. SIGKILL and resume (MLP) ----
"$KILN" train $MLP --checkpoint ck_kill --every 7 --log kill.csv --quiet &
pid=$!
i=0
until ls ck_kill 2> /dev/null | grep -q 'ckpt-00000006[3-9]\|ckpt-0000000[7-9]\|ckpt-0000001\|ckpt-0000002'; do
	i=$((i + 1))
	[ $i -lt 1200 ] || { kill -9 $pid; die "no checkpoint after 120 s"; }
	sleep 0.1
done
kill -9 $pid 2> /dev/null || echo "note: the run had finished before the kill"
wait $pid 2> /dev/null || true
"$KILN" train $MLP --checkpoint ck_kill --every 7 --log kill.csv --resume ck_kill > killed.log
cat killed.log
cmp mlp.csv kill.csv || die "the MLP resumed after SIGKILL differs from the uninterrupted run"
echo "MLP killed at $(sed -n 's/^resumed from .* at step \([0-9]*\).*/step \1/p' killed.log): identical curve"

# ---- 4. the .kir path and errors ----
"$KILN" train $D/mlp.onnx --x $D/train_x.npy --y $D/train_y.npy --epochs 1 --lr 0.05 \
	--momentum 0.9 --export mlp1.kir --quiet
[ -s mlp1.kir ] && [ -s mlp1.safetensors ] || die "no .kir export"
"$KILN" train mlp1.kir --x $D/train_x.npy --y $D/train_y.npy --val-x $D/test_x.npy \
	--val-y $D/test_y.npy --epochs 1 --lr 0.01 --momentum 0.9 > kir.log
cat kir.log
at_least 85 kir.log
expect 2 "unknown option '--bogus'" "$KILN" train $D/mlp.onnx --x a --y b --bogus
expect 2 "unknown --optimizer 'rmsprop'" "$KILN" train $D/mlp.onnx --x a --y b --optimizer rmsprop
expect 2 "bad --schedule 'cosine:x'" "$KILN" train $MLP --schedule cosine:x
expect 1 "is f32\[1438,1,8,8\], but the model's input is f32\[N,64\]" \
	"$KILN" train $D/mlp.onnx --x $D/train_img.npy --y $D/train_y.npy
expect 1 "train_x.npy is f32\[1438,64\], but the target" \
	"$KILN" train $D/mlp.onnx --x $D/train_x.npy --y $D/train_x.npy
echo "digits: all checks passed"
