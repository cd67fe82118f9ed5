#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build and test, skipping those
# already present.  As root it runs apt-get; otherwise it prints the command.
# KILN_DEPS=build installs only what the C build needs (no Python stack).
set -eu
build_pkgs="build-essential cmake pkg-config llvm-14-dev llvm-14-tools clang-14
  libclang-rt-14-dev check libprotobuf-c-dev protobuf-c-compiler libonnx-dev valgrind
  libopenmpi-dev openmpi-bin"
test_pkgs="python3-numpy python3-onnx python3-torch python3-torchvision
  python3-sklearn python3-venv python3-pytest graphviz"
pkgs=$build_pkgs
[ "${KILN_DEPS:-all}" = build ] || pkgs="$pkgs $test_pkgs"

missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
if [ -z "$missing" ]; then
	echo "install-deps: all packages present"
	exit 0
fi
echo "install-deps: missing:$missing"
if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: not root; run:  sudo apt-get update && sudo apt-get install -y$missing" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends $missing
