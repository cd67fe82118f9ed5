#!/usr/bin/env bash
# Builds the ONNX importer's libFuzzer target with clang and runs it.
#
#     tests/fuzz/run_fuzz.sh SECONDS [BUILD_DIR]
#
# BUILD_DIR (default: build) is a configured and built kiln build folder: the
# protobuf-c bindings it generated (BUILD_DIR/onnx_pb) are compiled in, with
# the sources the importer needs (ir/, frontend/onnx/, runtime/), using
# -fsanitize=fuzzer,address,undefined, into BUILD_DIR/fuzz/fuzz_onnx.  The
# seed corpus is every conformance model
# under BUILD_DIR (*/node/*/model.onnx, from tests/onnx/gen_node_tests.py)
# plus the real models under 1 MiB (BUILD_DIR/onnx_real, from
# tests/onnx/make_real_models.py); what the fuzzer finds is kept in
# BUILD_DIR/fuzz/corpus between runs, and crashes land in BUILD_DIR/fuzz.
# Exits 77 (ctest's skip code) when clang cannot build fuzz targets.
# KILN_FUZZ_CC picks the compiler; KILN_FUZZ_EXTRA adds flags or sources.
set -eu
secs=${1:?usage: run_fuzz.sh SECONDS [BUILD_DIR]}
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${2:-$src/build}" && pwd)
out=$bin/fuzz
cc=${KILN_FUZZ_CC:-$(command -v clang-14 || command -v clang || true)}
mkdir -p "$out/corpus" "$out/seeds"

if [ -z "$cc" ] || ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
	"$cc" -x c -fsanitize=fuzzer -o "$out/probe" - 2>/dev/null; then
	echo "skipped: no clang with -fsanitize=fuzzer (install clang-14 and libclang-rt-14-dev)"
	exit 77
fi
if [ ! -f "$bin/onnx_pb/onnx.pb-c.c" ]; then
	echo "run_fuzz: $bin/onnx_pb/onnx.pb-c.c missing: build kiln in $bin first" >&2
	exit 1
fi

# Rebuild when any source is newer than the binary.
# Only what the importer and exporter need: the IR, frontend/onnx, runtime.
srcs=$(ls "$src"/ir/*.c "$src"/frontend/onnx/*.c "$src"/runtime/*.c)
if [ ! -x "$out/fuzz_onnx" ] || [ -n "$(find "$src/ir" "$src/frontend/onnx" \
	"$src/runtime" "$src/include" "$src/tests/fuzz" -newer "$out/fuzz_onnx" \
	-name '*.[ch]' | head -1)" ]; then
	echo "run_fuzz: building $out/fuzz_onnx with $cc"
	# shellcheck disable=SC2086
	"$cc" -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -fno-omit-frame-pointer -w \
		-DKILN_BUILD=1 -D_GNU_SOURCE -I"$src/include" -I"$src" -I"$bin/onnx_pb" \
		$srcs "$bin/onnx_pb/onnx.pb-c.c" "$src/tests/fuzz/fuzz_onnx.c" \
		${KILN_FUZZ_EXTRA:-} $(pkg-config --libs libprotobuf-c) -lm -o "$out/fuzz_onnx.new"
	mv "$out/fuzz_onnx.new" "$out/fuzz_onnx"
fi

# Seeds: copied under stable names so reruns do not duplicate them.
n=0
for f in "$bin"/*/node/*/model.onnx "$bin"/onnx_real/*.onnx; do
	[ -f "$f" ] || continue
	[ "$(stat -c %s "$f")" -le 1048576 ] || continue
	name=$(echo "$f" | sed "s|^$bin/||; s|/|_|g")
	[ -f "$out/seeds/$name" ] || cp "$f" "$out/seeds/$name"
	n=$((n + 1))
done
echo "run_fuzz: $n seed models, fuzzing for $secs s"
[ "$n" -gt 0 ] || echo "run_fuzz: warning: no seeds (generate the conformance models first)"

cd "$out"
exec ./fuzz_onnx -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 \
	-malloc_limit_mb=2048 -max_len=1048576 -print_final_stats=1 corpus seeds
