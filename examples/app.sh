#!/usr/bin/env bash
# examples/app.sh: compile a model to a shared library
# with `kiln compile`, build examples/app/app.c against the generated
# model.h and model.so with the system C compiler (no kiln headers or
# libraries), and run it.
#     examples/app.sh [BUILD] [MODEL.kir|MODEL.onnx]
# Without a model it traces examples/cnn.c into cnn.kir first.  An ONNX file
# must have the example CNN's signature (f32[N,1,28,28] -> f32[N,10]); it is
# compiled under the C name "cnn", which app.c calls.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
model=${2:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -z "$model" ]; then
	"$build/cnn" "$out/cnn.kir" >/dev/null
	model=$out/cnn.kir
fi
echo "== kiln compile $(basename "$model") -o model.so"
"$build/kiln" compile "$model" -o "$out/model.so" --name cnn
echo "== readelf -d model.so (needed libraries)"
readelf -d "$out/model.so" | grep NEEDED
echo "== cc examples/app/app.c model.so -o app"
cc -O2 -Wall -Wextra -I"$out" "$root/examples/app/app.c" "$out/model.so" \
	-Wl,-rpath,"$out" -o "$out/app"
"$out/app"
