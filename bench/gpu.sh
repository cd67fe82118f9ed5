#!/bin/sh
# bench/gpu.sh: on a machine with an NVIDIA GPU, its driver and the CUDA
# toolkit: build kiln, run the CUDA tests (test_cuda then runs a compiled
# model on the GPU and compares it with the interpreter), and time the real
# models compiled with --target=cuda (docs/CUDA.md).
#   bench/gpu.sh [BUILD_DIR]
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-gpu}
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
nvidia-smi -L || { echo "no GPU visible (nvidia-smi)"; exit 77; }
cd "$build"
ctest -R 'onnx_node_tests_generate|onnx_real_models_gen' >/dev/null || true
ctest --output-on-failure -R 'test_cuda|cuda_|kir_golden'
for m in resnet18 mobilenet_v2 transformer_static; do
	f=onnx_real/$m.onnx
	[ -f "$f" ] || continue
	./kiln compile "$f" --target=cuda -o "/tmp/kiln_gpu_$m.so" --time-report
	./kiln compile "$f" --target=cuda --emit=cu -o "/tmp/kiln_gpu_$m.cu"
	echo "$m: $(grep -c 'KILN_KERNEL void' "/tmp/kiln_gpu_$m.cu") launches"
done
echo "timing runs: link a driver against /tmp/kiln_gpu_<model>.so and its .h (_run_device)"
