#!/usr/bin/env bash
# make demo: kiln's whole promise on sklearn's digits, in well under a minute:
#   1. a CNN written with the C DSL (examples/digits.c) is traced to .kir;
#   2. `kiln train` trains it ahead of time: the compiled training step
#      (forward, loss, backward, AdamW in one function), test accuracy
#      printed, the curve drawn to curve.svg, the model exported to ONNX;
#   3. `kiln quantize` makes an int8 QDQ model from 100 training images;
#   4. `kiln compile` turns it into a standalone .so, which a plain C
#      program (examples/app/digits_app.c, nothing of kiln but the generated
#      header) runs on the held-out images, printing its predictions;
#   5. ONNX Runtime runs the exported f32 model and agrees with kiln's
#      compiled f32 library on every held-out image.
# usage: examples/demo.sh [BUILD] [OUTDIR]   (OUTDIR kept; default: a temp dir)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)
kiln=$build/kiln
if [ -n "${2:-}" ]; then
	out=$2
	mkdir -p "$out"
else
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
cd "$out"
export KILN_CACHE_DIR=$out/cache
t0=$(date +%s)

echo "== 1. the model, written in C (examples/digits.c), and the digits data"
"$build/digits" digits.kir
/usr/bin/python3 "$root/tests/train/make_digits.py" data > /dev/null
echo "data: sklearn's digits, 1438 training and 359 held-out 8x8 images"
echo
echo "== 2. kiln train: the compiled training step (AdamW, cosine schedule, 10 epochs)"
"$kiln" train digits.kir --x data/train_img.npy --y data/train_y.npy \
	--val-x data/test_img.npy --val-y data/test_y.npy --optimizer adamw --lr 3e-3 \
	--schedule cosine --epochs 10 --batch 32 --seed 1 --plot curve.svg \
	--export digits.onnx
echo
echo "== 3. kiln quantize: int8 (QDQ ONNX) calibrated on 100 training images"
"$kiln" quantize digits.onnx --calib data/train_img.npy --samples 100 -o digits.int8.onnx |
	grep -v "^  " || true
echo
echo "== 4. kiln compile to a standalone .so; a plain C program runs it"
"$kiln" compile digits.int8.onnx -o digits.so --name digits
echo "needs only: $(readelf -d digits.so | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
cc -O2 -Wall -Wextra -I. "$root/examples/app/digits_app.c" digits.so -Wl,-rpath,"$out" -o app
./app data/test_img.npy data/test_y.npy
echo
echo "== 5. ONNX Runtime on the exported f32 model vs kiln's compiled f32 library"
"$kiln" compile digits.onnx -o digits_f32.so
"$kiln" run digits_f32.so -i x=data/test_img.npy -o f32_out > /dev/null
if [ -x "$root/.venv/bin/python" ] && "$root/.venv/bin/python" -c "import onnxruntime" 2> /dev/null; then
	"$root/.venv/bin/python" - << 'EOF'
import numpy as np
import onnxruntime as ort
ort.set_default_logger_severity(3)  # not the warning about num_batches_tracked, unused
x = np.load("data/test_img.npy")
ref = ort.InferenceSession("digits.onnx", providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
got = np.load("f32_out/logits.npy")
same = int((ref.argmax(1) == got.argmax(1)).sum())
print(f"ONNX Runtime {ort.__version__}: max |kiln - ORT| = {np.abs(got - ref).max():.2e}, "
      f"the same class on {same} of {len(x)} images")
EOF
else
	echo "(no ONNX Runtime venv: run scripts/setup-venv.sh to compare)"
fi
echo
echo "demo: done in $(($(date +%s) - t0)) s; curve.svg, digits.onnx, digits.int8.onnx and digits.so" \
	"are in ${2:-a temporary folder (pass OUTDIR to keep them)}"
