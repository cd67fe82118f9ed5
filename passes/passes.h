/*
 * passes.h: graph-to-graph passes and the pipeline that runs them, private
 * to the library; one section per file.
 *
 * Every pass is one function with one signature, exported by its own file
 * (QBE's layout), so the pipeline is a table from name to function and a
 * pass can be run alone from `kiln opt --passes=NAME`.  A pass reads and
 * rewrites the graph in place, reports failures through ir_errorf (so the
 * graph's sticky error names the node), and leaves a valid graph behind: a
 * schedule in SSA order, use lists intact, dead nodes compacted away.  Value
 * ids held outside the graph are invalid after any pass (ir_compact
 * renumbers them); graph inputs, outputs and parameters keep their names.
 */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stdbool.h>
#include <stdio.h>

#include "ir/ir.h"

/* Options shared by every pass; a zeroed struct means the defaults. */
typedef struct pass_opts {
	bool verify;            /* ir_verify after each pass (always with KILN_DEBUG) */
	const char *dump_after; /* pass name, or "all": print the IR after it */
	FILE *dump;             /* where dumps go (NULL: stderr) */
	int64_t fold_max_elems; /* fold: largest tensor it creates (0: 1M elements) */
} pass_opts;

typedef kiln_status (*pass_fn)(kiln_graph *g, const pass_opts *o);

/* ---- pipeline.c --------------------------------------------------------- */

#define PASS_DEFAULT "infer,fold,cse,dce"

typedef struct pass_info {
	const char *name;
	pass_fn run;
	const char *desc; /* one line, for `kiln opt --help` */
} pass_info;

/* The registry, in the order `kiln opt --help` lists it. */
extern const pass_info pass_table[];
extern const int pass_count;
const pass_info *pass_find(const char *name); /* NULL if unknown */
/* Runs a comma-separated list ("default" expands to PASS_DEFAULT; "" runs
 * nothing).  Every name is checked before any pass runs, so an unknown one
 * changes nothing; its message lists the known passes.  A pass error or a
 * verifier failure is copied into err and left in the graph. */
kiln_status pass_run_list(kiln_graph *g, const char *list, const pass_opts *o,
                          kiln_error *err);

/* ---- infer.c ------------------------------------------------------------ */

/* Re-runs shape inference over the schedule, in order. */
kiln_status pass_infer(kiln_graph *g, const pass_opts *o);

/* ---- fold.c ------------------------------------------------------------- */

/* Evaluates nodes whose inputs are all Constant outputs with the
 * interpreter's own kernels, and Shape of statically known dims; each result
 * becomes a Constant node.  Parameters are never folded: they are weights
 * that kiln_graph_load_params or training may replace later. */
kiln_status pass_fold(kiln_graph *g, const pass_opts *o);

/* ---- dce.c -------------------------------------------------------------- */

/* Removes nodes no graph output depends on; keeps inputs and parameters. */
kiln_status pass_dce(kiln_graph *g, const pass_opts *o);

/* ---- cse.c -------------------------------------------------------------- */

/* Merges nodes with the same op, inputs (in any order for IR_COMM ops) and
 * attributes; random ops are never merged. */
kiln_status pass_cse(kiln_graph *g, const pass_opts *o);

#endif /* KILN_PASSES_H */
