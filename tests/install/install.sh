#!/bin/sh
# install.sh: ctest `install` (cmake/install.cmake).  An installed kiln
# works where it is put and after it moves, without the build tree's help:
#
#   1. cmake --install BUILD --prefix T/first, then T/first is moved to
#      T/moved (no file may name T/first);
#   2. from another folder, with KILN_RT_LIB unset, T/moved/bin/kiln
#      reports its own lib/kiln/libkilnrt_gen.a as its runtime, compiles a
#      .kir model into a library, and a C program built against the
#      generated header alone gets values worked out by hand;
#      KILN_RT_LIB naming nothing, or a file that is no archive, fails
#      with a message naming it (and for the link, the command) and
#      leaves no library; libkiln.so exports kiln.h's kiln_* only;
#   3. tests/install/prog.c (the C DSL, the interpreter, kiln_compile,
#      kiln_load: values worked out by hand) built with
#      `pkg-config --cflags --libs kiln` against libkiln.so (its runtime:
#      found beside libkiln.so) and with `pkg-config --static` against
#      libkiln.a (its runtime: $KILN_RT_LIB), then with CMake's
#      find_package(kiln) against kiln::kiln and kiln::kiln_static.
#
#     install.sh BUILD SRC SANITIZE
# SANITIZE 1 (a KILN_SANITIZE build): the installed libkiln is sanitized,
# so the programs that link it are built with -fsanitize=address,undefined.
# Exit 77 (skipped) when cc, cmake, pkg-config, readelf or nm is missing.
set -eu
build=$1
src=$2
san=""
[ "$3" = 1 ] && san="-fsanitize=address,undefined"
for t in cc cmake pkg-config readelf nm; do
	if ! command -v "$t" >/dev/null 2>&1; then
		echo "install: skipped: no $t (scripts/install-deps.sh installs it)"
		exit 77
	fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
	echo "install: FAIL: $*" >&2
	exit 1
}

# ---- 1. install, then move -------------------------------------------------
cmake --install "$build" --prefix "$tmp/first" >"$tmp/install.log" ||
	{ cat "$tmp/install.log"; fail "cmake --install"; }
mv "$tmp/first" "$tmp/moved"
P=$(cd "$tmp/moved" && pwd -P)
for f in bin/kiln lib/libkiln.so lib/libkiln.a lib/kiln/libkilnrt_gen.a include/kiln/kiln.h \
	lib/pkgconfig/kiln.pc lib/cmake/kiln/kilnConfig.cmake lib/cmake/kiln/kilnConfigVersion.cmake; do
	[ -e "$P/$f" ] || fail "$f was not installed"
done
if grep -rlF "$tmp/first" "$P"; then
	fail "the files above name the prefix they were installed to"
fi
readelf -d "$P/lib/libkiln.so" | grep -q 'SONAME.*libkiln\.so\.0\.1\]' ||
	fail "libkiln.so has no SONAME libkiln.so.0.1"
# the public API only: kiln.h's kiln_* (and the linker's own _edata...)
other=$(nm -D --defined-only "$P/lib/libkiln.so" | awk '$3 !~ /^(kiln_|_)/ { print $3 }' | head -5)
[ -z "$other" ] || fail "libkiln.so exports more than kiln.h's API: $other ..."
nm -D --defined-only "$P/lib/libkiln.so" | grep -q ' T kiln_tensor_new$' ||
	fail "libkiln.so does not export the runtime's kiln_tensor_new"
rt="$P/lib/kiln/libkilnrt_gen.a"

unset KILN_RT_LIB
export KILN_CACHE_DIR="$tmp/cache"
mkdir "$tmp/work"
cd "$tmp/work"

# ---- 2. the installed CLI --------------------------------------------------
"$P/bin/kiln" --version >version.txt
grep -qxF "runtime: $rt" version.txt || { cat version.txt; fail "kiln --version: runtime is not $rt"; }

cat >sq.kir <<'EOF'
graph @sq(%x: f32[N,4]) -> (%y: f32[N,4]) {
  %a = mul %x, %x : f32[N,4]
  %b = relu %x : f32[N,4]
  %y = sub %a, %b : f32[N,4]
  ret %y
}
EOF
"$P/bin/kiln" compile sq.kir -o sq.so 2>compile.log || { cat compile.log; fail "kiln compile"; }
cat >drive.c <<'EOF'
#include <stdio.h>
#include "sq.h"
int main(void)
{
	float x[8] = {-2, 3, 0.5f, -1, 4, -0.25f, 0, 1.5f}, y[8];
	sq_ctx *c = sq_create();
	if (!c || sq_run(c, 2, x, y) != 0)
		return 1;
	for (int i = 0; i < 8; i++)
		printf("%g%s", y[i], i < 7 ? " " : "\n");
	sq_destroy(c);
	return 0;
}
EOF
cc -o drive drive.c ./sq.so -Wl,-rpath,"$tmp/work"
want="4 6 -0.25 1 12 0.0625 0 0.75"
got=$(./drive) || fail "the generated library's run failed"
[ "$got" = "$want" ] || fail "sq.so computed '$got', want '$want'"

if KILN_RT_LIB="$tmp/none.a" "$P/bin/kiln" compile sq.kir -o bad.so 2>err.txt; then
	fail "kiln compile succeeded with KILN_RT_LIB naming no file"
fi
grep -qF "KILN_RT_LIB is '$tmp/none.a'" err.txt || { cat err.txt; fail "no message naming \$KILN_RT_LIB"; }
echo "not an archive" >bogus.a
if KILN_RT_LIB="$tmp/work/bogus.a" "$P/bin/kiln" compile sq.kir -o bad.so 2>err.txt; then
	fail "kiln compile succeeded linking a file that is no archive"
fi
grep -q "bad.so: linking failed: 'cc' exited with status [1-9].*; the command: cc .*$tmp/work/bogus.a" err.txt ||
	{ cat err.txt; fail "the link's failure does not name the command and the archive"; }
[ ! -e bad.so ] || fail "a failed compile left bad.so"

# ---- 3. a program against the installed library ---------------------------
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
[ "$(pkg-config --modversion kiln)" = 0.1.0 ] || fail "pkg-config --modversion kiln"
check_prog() { # NAME: ran NAME into NAME.out; its runtime must be $2
	grep -qx "interpreter: ok" "$1.out" && grep -qx "compiled: ok" "$1.out" ||
		{ cat "$1.out"; fail "$1: wrong values"; }
	grep -qxF "runtime: $2" "$1.out" || { cat "$1.out"; fail "$1: its runtime is not $2"; }
}
# shellcheck disable=SC2046 # pkg-config's words are meant to split
cc $san -o prog_pc "$src/tests/install/prog.c" $(pkg-config --cflags --libs kiln) -lm \
	-Wl,-rpath,"$P/lib"
readelf -d prog_pc | grep -q 'NEEDED.*libkiln\.so\.0\.1\]' || fail "prog_pc does not need libkiln.so.0.1"
mkdir pc
./prog_pc pc >prog_pc.out 2>&1 || { cat prog_pc.out; fail "prog_pc"; }
check_prog prog_pc "$rt"

# shellcheck disable=SC2046
cc $san -o prog_pc_static "$src/tests/install/prog.c" $(pkg-config --cflags kiln) \
	$(pkg-config --static --libs kiln | sed 's/-lkiln\( \|$\)/-l:libkiln.a /')
if readelf -d prog_pc_static | grep -q 'NEEDED.*libkiln'; then
	fail "prog_pc_static needs libkiln.so"
fi
mkdir pcs
KILN_RT_LIB="$rt" ./prog_pc_static pcs >prog_pc_static.out 2>&1 ||
	{ cat prog_pc_static.out; fail "prog_pc_static"; }
check_prog prog_pc_static "$rt"

mkdir cm
cat >cm/CMakeLists.txt <<EOF
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(kiln 0.1 REQUIRED)
add_executable(prog_cm "$src/tests/install/prog.c")
target_link_libraries(prog_cm PRIVATE kiln::kiln m)
add_executable(prog_cm_static "$src/tests/install/prog.c")
target_link_libraries(prog_cm_static PRIVATE kiln::kiln_static)
EOF
cmake -S cm -B cm/build -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Debug \
	-DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" >cm.log 2>&1 ||
	{ cat cm.log; fail "find_package(kiln)"; }
cmake --build cm/build -j 2 >>cm.log 2>&1 || { cat cm.log; fail "building against kiln::kiln"; }
readelf -d cm/build/prog_cm | grep -q 'NEEDED.*libkiln\.so\.0\.1\]' || fail "prog_cm does not need libkiln.so.0.1"
mkdir cms cmss
cm/build/prog_cm cms >prog_cm.out 2>&1 || { cat prog_cm.out; fail "prog_cm"; }
check_prog prog_cm "$rt"
KILN_RT_LIB="$rt" cm/build/prog_cm_static cmss >prog_cm_static.out 2>&1 ||
	{ cat prog_cm_static.out; fail "prog_cm_static"; }
check_prog prog_cm_static "$rt"
echo "install: ok ($P: CLI, pkg-config and find_package, shared and static)"
