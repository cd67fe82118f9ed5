#!/bin/sh
# bench/gpu.sh: on a machine with an NVIDIA GPU, its driver and the CUDA
# toolkit: build kiln, run the CUDA tests (test_cuda then runs a compiled
# model on the GPU and compares it with the interpreter; test_cuda_emu_train
# trains the MLP and the CNN 20 steps on the GPU through their CUDA training
# libraries against the CPU libraries, losses within 1e-4 relative), and
# compile the real models with --target=cuda (docs/CUDA.md).  Without a GPU
# it says so and exits 77 (skipped) before building anything.
#   bench/gpu.sh [BUILD_DIR]
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-gpu}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
	echo "skipped: no GPU visible (nvidia-smi)"
	exit 77
fi
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest -R 'onnx_node_tests_generate|onnx_real_models_gen' >/dev/null || true
ctest --output-on-failure -R '^test_cuda$|^cuda_|_cuda_emu$|kir_golden'
# the training run: its lines say how close the GPU came; none means the
# libraries could not open the GPU (the test then only checked the message)
CK_FORK=no ./test_cuda_emu_train | tee /tmp/kiln_gpu_train.log
if ! grep -q 'on the GPU against the CPU library' /tmp/kiln_gpu_train.log; then
	echo "the CUDA training libraries did not run on the GPU (see _create_ex above)"
	exit 1
fi
for m in resnet18 mobilenet_v2 transformer_static; do
	f=onnx_real/$m.onnx
	[ -f "$f" ] || continue
	./kiln compile "$f" --target=cuda -o "/tmp/kiln_gpu_$m.so" --time-report
	./kiln compile "$f" --target=cuda --emit=cu -o "/tmp/kiln_gpu_$m.cu"
	echo "$m: $(grep -c 'KILN_KERNEL void' "/tmp/kiln_gpu_$m.cu") launches"
done
echo "timing runs: link a driver against /tmp/kiln_gpu_<model>.so and its .h (_run_device)"
