/*
 * frontend.h: helpers shared by the tracing DSL (dsl.c) and the layers
 * built on it (layers.c), private to frontend/ and the tools built on it
 * (tools/train.c derives its train-mode graph with fe_bn_batch_stats).
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

/* ---- layers.c ------------------------------------------------------------ */

typedef struct fe_bn_stats {
	kiln_value mean, var; /* [C]: what BatchNormalization reads */
	kiln_value unbiased;  /* var n/(n-1): what running_var tracks */
} fe_bn_stats;

/* Batch statistics of x over every axis but 1, of dtype dt, as PyTorch's
 * training-mode batch norm takes them (kiln_batchnorm in train mode and
 * `kiln train`'s derived graph).  Composed from ops, so gradients flow
 * through them.  A failure is recorded in g as by any builder: check g's
 * status before using the values. */
fe_bn_stats fe_bn_batch_stats(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype dt);

#endif /* KILN_FRONTEND_H */
