/*
 * infer.c: the `infer` pass, shape inference over the whole schedule.
 *
 * Builders and the .kir parser infer each node's types as they create it,
 * so on a fresh graph this pass changes nothing.  It exists for graphs whose
 * types went stale: after a rewrite changed an operand, after parameters
 * were replaced, or for a graph read from a file that only declared its
 * inputs.  The schedule is in SSA order, so one forward sweep sees every
 * node's input types already settled; the first error stops it and names
 * the node (ir_infer_node records it through ir_errorf).
 */
#include "passes/passes.h"

kiln_status pass_infer(kiln_graph *g, const pass_opts *o)
{
	for (uint32_t i = 0; i < g->nnode; i++) {
		ir_node *n = g->node[i];
		if (n->dead)
			continue;
		kiln_status st = ir_infer_node(g, n);
		if (st != KILN_OK)
			return st;
	}
	return g->status;
}
