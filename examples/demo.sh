#!/usr/bin/env bash
# make demo: trace the bundled CNN with the C DSL and run a batch through
# the reference interpreter, inspect the saved graph with the kiln CLI, then
# compile it to a standalone .so and run it from a plain C program that
# includes only the generated model.h.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== tracing examples/cnn.c and running a batch of 4 through the interpreter"
"$build/cnn" "$out/cnn.kir"
echo
echo "== kiln inspect cnn.kir --no-ir"
"$build/kiln" inspect "$out/cnn.kir" --no-ir
echo
bash "$root/examples/app.sh" "$build" "$out/cnn.kir"
