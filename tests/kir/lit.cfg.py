# lit.cfg.py: the .kir golden tests.  Each test is a .kir file whose RUN
# lines pipe it through the kiln CLI into FileCheck, as in MLIR:
#     # RUN: %kiln opt %s | FileCheck %s
# Paths come from lit.site.cfg.py, which CMake generates in the build tree.
import os

import lit.formats

config.name = "kiln-kir"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".kir"]
config.excludes = ["Inputs"]

if not hasattr(config, "kiln_bin"):
    lit_config.fatal("run lit on the build tree (build/tests/kir), not the source tree")

config.substitutions.append(("%kiln", config.kiln_bin))
config.substitutions.append(("FileCheck", config.filecheck))
# `not` inverts a command's exit status, for tests of rejected input
# (a regex: a whole word followed by a space, so "cannot " is left alone)
config.substitutions.append((r"(?<![\w./-])not(?= )", os.path.join(config.llvm_tools_dir, "not")))
