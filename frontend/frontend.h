/*
 * frontend.h: helpers shared by the tracing DSL (dsl.c) and the layers
 * built on it (layers.c), private to frontend/.
 *
 * The key promise of the DSL is that a failed call leaves the graph exactly
 * as it was before the call, apart from the recorded error: a builder that
 * adds several nodes or parameters takes a mark first and rolls back to it
 * when anything fails, so after kiln_graph_clear_error() tracing can go on
 * from a valid graph.
 */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "ir/ir.h"

/* ---- dsl.c -------------------------------------------------------------- */

/* How far the graph had grown: everything past it is undone by rollback. */
typedef struct fe_mark {
	uint32_t nnode, nval, ninput, noutput;
} fe_mark;

fe_mark fe_mark_of(const kiln_graph *g);
/* Removes the nodes, values, inputs and outputs added since m.  Nothing
 * created before m may refer to what is removed, which holds for tracing. */
void fe_rollback(kiln_graph *g, fe_mark m);
/* The live value v, or NULL after recording KILN_EINVAL at loc saying which
 * operand (what) of which op is bad.  Never call with a graph in error. */
const ir_value *fe_value(kiln_graph *g, kiln_loc loc, const char *op, const char *what,
                         kiln_value v);
/* True when some live input, parameter or named value already has name. */
bool fe_name_taken(const kiln_graph *g, const char *name);

#endif /* KILN_FRONTEND_H */
