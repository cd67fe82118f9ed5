/*
 * build.h: the IR's typed node builder (build.c), the kiln_*_at functions of
 * kiln.h.  The C DSL (frontend/), the gradient rules and the optimizer
 * rewrite (passes/) and the drivers all build nodes through it; these are
 * the helpers that composites built on it (frontend/layers.c, losses.c)
 * share.
 *
 * The key promise of the builder is that a failed call leaves the graph
 * exactly as it was before the call, apart from the recorded error: a
 * builder that adds several nodes or parameters takes a mark first and
 * rolls back to it when anything fails, so after kiln_graph_clear_error()
 * tracing can go on from a valid graph.
 */
#ifndef KILN_IR_BUILD_H
#define KILN_IR_BUILD_H

#include "ir/ir.h"

/* How far the graph had grown: everything past it is undone by rollback. */
typedef struct ir_mark {
	uint32_t nnode, nval, ninput, noutput;
} ir_mark;

ir_mark ir_mark_of(const kiln_graph *g);
/* Removes the nodes, values, inputs and outputs added since m.  Nothing
 * created before m may refer to what is removed, which holds for tracing. */
void ir_rollback(kiln_graph *g, ir_mark m);
/* The live value v, or NULL after recording KILN_EINVAL at loc saying which
 * operand (what) of which op is bad.  Never call with a graph in error. */
const ir_value *ir_operand(kiln_graph *g, kiln_loc loc, const char *op, const char *what,
                           kiln_value v);
/* True when some live input, parameter or named value already has name. */
bool ir_name_taken(const kiln_graph *g, const char *name);

#endif /* KILN_IR_BUILD_H */
