/*
 * cli.c: the steps of the `kiln` CLI that need a graph's nodes, which
 * tools/ does not see (driver/driver.h).
 */
#include <string.h>

#include "driver/driver.h"
#include "ir/ir.h"

kiln_status driver_compile_train_inference(const kiln_graph *g, uint64_t seed,
                                           const kiln_train_opts *t, int64_t batch,
                                           const char *out_path, const kiln_compile_opts *o,
                                           kiln_error *e)
{
	/* a training-mode export evaluates as its inference model (running
	 * stats, Dropout off); any other model is its own */
	kiln_graph *tg = NULL, *eval = NULL;
	kiln_status st = kiln_inference_graph_from_train(g, &eval, NULL, e);
	if (st == KILN_OK)
		st = kiln_train_graph_from_inference(eval, seed, &tg, e);
	if (st == KILN_OK)
		st = kiln_compile_train(tg, eval, t, batch, out_path, o, e);
	/* a conv's weight gradient is a convolution with the batch as its
	 * reduced channel axis, which the lowering needs fixed: say what to do,
	 * not the lowering's "symbolic channel counts" */
	for (uint32_t i = 0; st != KILN_OK && !batch && e && strstr(e->msg, "symbolic channel") &&
	                     i < g->nnode; i++) {
		const ir_node *n = g->node[i];
		char d[160];
		if (!n->dead && (n->op == KILN_OP_CONV || n->op == KILN_OP_CONV_TRANSPOSE))
			st = ir_seterr(e, st, "training a model with %s needs a fixed batch size: pass "
			               "--batch N", ir_node_desc(n, d, sizeof d));
	}
	kiln_graph_free(tg);
	kiln_graph_free(eval);
	return st;
}
