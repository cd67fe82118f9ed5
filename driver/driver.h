/*
 * driver.h: the driver's internal header, for the `kiln` CLI (tools/) and
 * nothing below the driver.
 *
 * The drivers (compile.c: kiln_compile, kiln_compile_train; train.c:
 * kiln_build_train_step, kiln_train_graph_from_inference, kiln_trainer) are
 * declared in include/kiln/kiln.h, the public API.  The CLI also reads what
 * the public API does not offer, and reaches it through this header only:
 *
 *   - the graph's structure (ir/ir.h): `kiln inspect` walks nodes and
 *     values, `kiln train` adds its accuracy counters and reads parameters;
 *   - the pass registry (passes/passes.h): `kiln opt --passes=...` runs a
 *     pass list and lists the passes in its help;
 *   - file kinds (runtime/rt.h): every input is sniffed before it is opened.
 *
 * So tools/ includes kiln/kiln.h, this header and its own, and no other
 * folder's header (tests/layers/check_layers.py checks it); narrowing these
 * three to functions of the driver is the way to make the CLI a client of
 * kiln.h alone.
 */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include "kiln/kiln.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/rt.h"

#endif /* KILN_DRIVER_H */
