#!/usr/bin/env bash
# make demo: trace the bundled CNN with the C DSL, print its IR summary, run a
# batch through the reference interpreter, then inspect and run the saved
# graph with the kiln CLI.
set -euo pipefail
build=${1:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== tracing examples/cnn.c and running a batch of 4 through the interpreter"
"$build/cnn" "$out/cnn.kir"
echo
echo "== kiln inspect $out/cnn.kir --no-ir"
"$build/kiln" inspect "$out/cnn.kir" --no-ir
