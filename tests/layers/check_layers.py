#!/usr/bin/python3
"""check_layers.py: no folder of kiln includes or calls a folder above it or
a sibling (docs/ARCHITECTURE.md, "Layers").

    check_layers.py SRCDIR BUILDDIR
    check_layers.py --dot [FILE] the picture of the layers, as Graphviz;
                                 with FILE (docs/layers.dot, ctest
                                 layers_dot): exit 1 when FILE differs

Floors, lowest first:

    runtime/ < ir/ < {frontend/, passes/, codegen/} < driver/ < tools/

frontend/, passes/ and codegen/ are siblings: none includes or calls
another.  include/kiln/kiln.h is the public API and may be included from
anywhere.  The CLI is a client of the public API: tools/ may include only
kiln/kiln.h, driver/driver.h and its own headers, and driver/driver.h
includes kiln/kiln.h and no header of ir/, passes/, runtime/ or any other
folder.

(a) Includes: every `#include "folder/..."` in the source folders is read;
    one that reaches a folder above or beside its own fails, naming the file
    and line.  So does any include of tools/ but those three (a bare
    "x.h" must be a file in tools/), and any include of driver/driver.h
    but kiln/kiln.h and system headers.
(b) Calls: `nm` of every object file the build made for each folder (CMake
    keeps them under BUILDDIR/CMakeFiles/<target>.dir/<folder>/); a symbol a
    folder uses but does not define, which is defined only in folders above
    it or beside it, fails, naming the object and the symbol.  Symbols
    defined nowhere in kiln (libc, LLVM, protobuf-c) are not ours to judge.
    The generated protobuf-c bindings (onnx_pb/) count as frontend/.
    tools/ may call, of kiln's own symbols, only those defined in tools/ or
    declared by include/kiln/kiln.h or driver/driver.h: a call to any other
    (ir_*, pass_*, rt_*...) fails even though its folder is below.

(c) A backend (BACKEND) calls nothing of ir/ but BACKEND_MAY_CALL_IR, so
    it reads the cg_module only, and no file outside it includes its
    header codegen/llvm.h.

Exit status 0 when the layering holds, 1 with one line per violation when
not, 2 when the build has no objects to read.  Besides the floors, a few
pairs of files inside one folder must call one way only (ONE_WAY).
"""
import os
import re
import subprocess
import sys

FLOOR = {"runtime": 0, "ir": 1, "frontend": 2, "passes": 2, "codegen": 2,
         "driver": 3, "tools": 4}
FOLDERS = list(FLOOR)
# the CMake targets whose objects are read, and the folders each is built
# from (the generated protobuf-c bindings, onnx_pb/, go into kiln with
# frontend/); kilnrt_gen repeats kilnrt's sources, never sanitized
TARGETS = {"kiln_cli": ["tools"],
           "kiln": ["driver", "frontend", "passes", "codegen", "ir"],
           "kilnrt": ["runtime"]}
# what tools/ may include besides its own headers (item: the CLI is a client
# of the public header and the driver's documented header only)
TOOLS_MAY_INCLUDE = {"kiln/kiln.h", "driver/driver.h"}
# the headers whose declarations are all tools/ may call
CLIENT_HEADERS = ["include/kiln/kiln.h", "driver/driver.h"]
# what driver/driver.h, the driver's header for tools/, may include besides
# system headers: it must not pass an internal header through to the CLI
DRIVER_H = "driver/driver.h"
DRIVER_H_MAY_INCLUDE = {"kiln/kiln.h"}
# within a folder: (a, b) means a's object may not call anything b defines
# (the ONNX node walk calls the per-op table, never the reverse; both share
# onnx_node.c)
ONE_WAY = [("frontend/onnx/onnx_ops.c", "frontend/onnx/onnx_import.c")]
# A backend reads only the cg_module it is given, never the graph
# (codegen/backend.h): from ir/ its files may call only these (dtypes,
# errors, tensor sizes); and only codegen/'s backend files include its
# private header.
BACKEND = ["codegen/llvm.c", "codegen/llvm_lib.c", "codegen/llvm_emit.c",
           "codegen/llvm_gemm.c", "codegen/llvm_qgemm.c", "codegen/target.c",
           "codegen/emit.c"]
BACKEND_MAY_CALL_IR = {"ir_seterr", "kiln_dtype_name", "kiln_dtype_size",
                       "kiln_dtype_is_float", "kiln_tensor_nbytes"}
BACKEND_HEADER = "codegen/llvm.h"


def may_use(user, used):
    """True when folder user may include or call folder used."""
    return user == used or FLOOR[used] < FLOOR[user]


def folder_of(path):
    """The layer folder of a path relative to the source dir, or None."""
    top = path.split("/", 1)[0]
    if top == "onnx_pb":
        return "frontend"
    return top if top in FLOOR else None


def check_includes(src):
    bad = []
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    for folder in FOLDERS:
        root = os.path.join(src, folder)
        for dirpath, _, files in os.walk(root):
            for f in sorted(files):
                if not f.endswith((".c", ".h", ".def")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, src)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = inc.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        top = target.split("/", 1)[0] if "/" in target else None
                        if rel == DRIVER_H and target not in DRIVER_H_MAY_INCLUDE:
                            bad.append("%s:%d: %s includes \"%s\": the CLI's header "
                                       "includes only kiln/kiln.h, so no internal "
                                       "header reaches tools/" % (rel, lineno, rel, target))
                            continue
                        if folder == "tools":
                            own = top == "tools" or (top is None and os.path.exists(
                                os.path.join(dirpath, target)))
                            if not own and target not in TOOLS_MAY_INCLUDE:
                                bad.append("%s:%d: tools/ includes \"%s\": only "
                                           "kiln/kiln.h, driver/driver.h and tools/'s own"
                                           % (rel, lineno, target))
                            continue
                        if target == BACKEND_HEADER and rel not in BACKEND and \
                                rel != BACKEND_HEADER:
                            bad.append("%s:%d: includes \"%s\", the LLVM backend's own "
                                       "header: use codegen/backend.h"
                                       % (rel, lineno, target))
                        if top is None or top not in FLOOR:
                            continue  # same-folder header, kiln/kiln.h, system
                        if not may_use(folder, top):
                            kind = "a sibling" if FLOOR[top] == FLOOR[folder] \
                                else "a folder above it"
                            bad.append("%s:%d: %s/ includes \"%s\" from %s (%s/)"
                                       % (rel, lineno, folder, target, kind, top))
    return bad


def objects(src, build):
    """{object path: folder} for every object CMake built from a layer's
    source that still exists (a moved file leaves its old object behind)."""
    out = {}
    base = os.path.join(build, "CMakeFiles")
    if not os.path.isdir(base):
        return out
    for target in sorted(os.listdir(base)):
        # the libraries and the CLI; tests, examples, benches and the
        # never-sanitized runtime copy (kilnrt_gen) repeat or use them
        if target[:-len(".dir")] not in TARGETS or not target.endswith(".dir"):
            continue
        tdir = os.path.join(base, target)
        for dirpath, _, files in os.walk(tdir):
            for f in files:
                if not f.endswith(".o"):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, tdir)
                folder = folder_of(rel)
                if folder and not rel.startswith("onnx_pb/") and \
                        not os.path.exists(os.path.join(src, rel[:-2])):
                    continue
                if folder:
                    out[path] = folder
    return out


def nm(path):
    """(defined, undefined) global symbol names of one object."""
    res = subprocess.run(["nm", "-P", path], capture_output=True, text=True,
                         check=True)
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRCVWGS" and kind.isupper():
            defined.add(name)
    return defined, undefined


def client_api(src):
    """Names of the functions and globals CLIENT_HEADERS themselves declare
    (not what they include), read from the preprocessor's output: kiln.h
    declares its elementwise builders through X-macros."""
    names = set()
    decl = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
    marker = re.compile(r'^#\s*\d+\s+"([^"]*)"')
    own = {os.path.realpath(os.path.join(src, h)) for h in CLIENT_HEADERS}
    cc = os.environ.get("CC") or "cc"
    for h in CLIENT_HEADERS:
        res = subprocess.run([cc, "-E", "-I", os.path.join(src, "include"), "-I", src,
                              os.path.join(src, h)],
                             capture_output=True, text=True, check=True)
        keep = False
        for line in res.stdout.splitlines():
            m = marker.match(line)
            if m:
                keep = os.path.realpath(m.group(1)) in own
            elif keep:
                names.update(decl.findall(line))
    return names


def check_calls(src, build):
    objs = objects(src, build)
    if not objs:
        return None
    where = {}  # symbol -> set of folders defining it
    uses = []
    for path, folder in sorted(objs.items()):
        defined, undefined = nm(path)
        for s in defined:
            where.setdefault(s, set()).add(folder)
        uses.append((path, folder, undefined))
    bad = []
    by_src = {}
    for path, folder in objs.items():
        tdir = path.split(os.sep + "CMakeFiles" + os.sep, 1)[1].split(os.sep, 1)[1]
        by_src[tdir[:-2]] = path
    for a, b in ONE_WAY:
        if a in by_src and b in by_src:
            bdef = nm(by_src[b])[0]
            for s in sorted(nm(by_src[a])[1] & bdef):
                bad.append("%s: calls %s, defined in %s (the calls run one way: %s -> %s)"
                           % (a, s, b, b, a))
    api = client_api(src)
    for f in BACKEND:
        if f not in by_src:
            continue
        for s in sorted(nm(by_src[f])[1]):
            if where.get(s) == {"ir"} and s not in BACKEND_MAY_CALL_IR:
                bad.append("%s: the backend calls %s of ir/ (a backend reads only its "
                           "cg_module: codegen/backend.h)" % (f, s))
    for path, folder, undefined in uses:
        rel = os.path.relpath(path, build)
        for s in sorted(undefined):
            homes = where.get(s)
            if not homes:
                continue
            if folder == "tools" and "tools" not in homes and s not in api:
                bad.append("%s: tools/ calls %s (defined in %s/), which neither "
                           "kiln/kiln.h nor driver/driver.h declares"
                           % (rel, s, "/, ".join(sorted(homes))))
                continue
            if any(may_use(folder, h) for h in homes):
                continue
            home = sorted(homes)[0]
            kind = "a sibling" if FLOOR[home] == FLOOR[folder] else "a folder above it"
            bad.append("%s: %s/ calls %s, defined only in %s (%s/)"
                       % (rel, folder, s, kind, "/, ".join(sorted(homes))))
    return bad


def dot():
    """The layers as a Graphviz digraph: one box per folder inside its CMake
    target, an arrow from each folder to the floor just below it (what it
    may include and call, and so everything below that), tools/ to the two
    headers it may include."""
    target_label = {
        "kiln_cli": "target kiln_cli: the `kiln` executable",
        "kiln": "target kiln: libkiln.a",
        "kilnrt": "target kilnrt: libkilnrt.a\\n(kilnrt_gen: the same sources, linked "
                  "into every compiled model)"}
    out = ["// docs/layers.dot: written by tests/layers/check_layers.py --dot",
           "// (ctest layers_dot fails when it is stale).  Render with",
           "//   dot -Tsvg docs/layers.dot -o docs/layers.svg",
           "digraph layers {",
           '\tgraph [rankdir=TB, fontname="Helvetica", fontsize=11, labelloc=b, '
           'label="an arrow: may include and call it and every floor below it; '
           'siblings on one row use none of each other;\\n'
           'tools/ may use kiln/kiln.h and driver/driver.h only '
           '(checked by tests/layers/check_layers.py, ctest layers)"];',
           '\tnode [shape=box, style=rounded, fontname="Helvetica", fontsize=11];',
           '\tedge [fontname="Helvetica", fontsize=9];']
    for t, folders in TARGETS.items():
        out.append("\tsubgraph cluster_%s {" % t)
        out.append('\t\tlabel="%s"; style=dashed; fontsize=10;' % target_label[t])
        for f in folders:
            out.append('\t\t"%s/";' % f)
        for lo in sorted({FLOOR[f] for f in folders}):
            row = [f for f in folders if FLOOR[f] == lo]
            if len(row) > 1:  # siblings side by side
                out.append("\t\t{ rank=same; %s }" % " ".join('"%s/";' % f for f in row))
        out.append("\t}")
    out.append('\t"kiln/kiln.h" [shape=note, label="include/kiln/kiln.h\\npublic API, '
               'includable anywhere;\\ndefined by the floor that owns each call"];')
    out.append('\t"driver/driver.h" [shape=note, label="driver/driver.h\\nincludes '
               'kiln/kiln.h only"];')
    out.append('\t"tools/" -> "kiln/kiln.h" [label="includes, calls"];')
    out.append('\t"tools/" -> "driver/driver.h" [label="includes, calls"];')
    out.append('\t"driver/driver.h" -> "driver/" [style=dashed, arrowhead=none];')
    for f in FOLDERS:
        if f == "tools":
            continue
        below = [b for b in FOLDERS if FLOOR[b] < FLOOR[f]]
        if below:
            top = max(FLOOR[b] for b in below)
            for b in FOLDERS:
                if FLOOR[b] == top:
                    out.append('\t"%s/" -> "%s/";' % (f, b))
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    if sys.argv[1:2] == ["--dot"] and len(sys.argv) <= 3:
        if len(sys.argv) == 2:
            sys.stdout.write(dot())
            return 0
        with open(sys.argv[2], encoding="utf-8") as fh:
            if fh.read() == dot():
                return 0
        print("check_layers: %s is stale: regenerate it with "
              "tests/layers/check_layers.py --dot > %s" % (sys.argv[2], sys.argv[2]))
        return 1
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    src, build = sys.argv[1], sys.argv[2]
    bad = check_includes(src)
    calls = check_calls(src, build)
    if calls is None:
        sys.stderr.write("check_layers: no object files under %s/CMakeFiles\n" % build)
        return 2
    bad += calls
    for b in bad:
        print(b)
    if bad:
        print("check_layers: %d violation(s) of the layering (docs/ARCHITECTURE.md)"
              % len(bad))
        return 1
    print("check_layers: the layering holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
