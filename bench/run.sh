#!/usr/bin/env bash
# bench/run.sh: kiln vs ONNX Runtime vs PyTorch on the MLP, a small CNN,
# ResNet-18, MobileNetV2, a transformer encoder block, SqueezeNet 1.1 and
# ShuffleNetV2 x1.0, batch 1 and 16,
# 1 and 2 threads, side by side in one run; writes docs/PERFORMANCE.md.
#     bench/run.sh [--quick | --only NAME[,NAME...]] [--time S] [--rounds R]
#                                             (BUILD=build-bench by default)
# Builds kiln (Release) if needed, creates .venv for onnxruntime
# (scripts/setup-venv.sh), exports the models with PyTorch (bench/models.py)
# and runs bench/bench.py.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-bench}
models=${MODELS_DIR:-$build/bench-models}
# --only NAME[,NAME...] exports and times just those models and prints the
# table instead of writing docs/PERFORMANCE.md.
quick=()
out=(--out "$root/docs/PERFORMANCE.md")
prev=
for a in "$@"; do
	[ "$a" = --quick ] && quick=(--quick)
	[ "$prev" = --only ] && quick=(--only "$a") && out=()
	prev=$a
done

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target kiln_cli >/dev/null
cmake --build "$build" -j "$(nproc)" --target gemm_bench >/dev/null 2>&1 || true
bash "$root/scripts/setup-venv.sh"
/usr/bin/python3 "$root/bench/models.py" "$models" "${quick[@]}"
cd "$root"
"$root/.venv/bin/python" "$root/bench/bench.py" --kiln "$build/kiln" --models "$models" \
	"${out[@]}" --command "${BUILD:+BUILD=$BUILD }bench/run.sh $*" "$@"
