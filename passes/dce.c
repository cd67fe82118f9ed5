/*
 * dce.c: the `dce` pass, dead-code elimination.
 *
 * A node is live when one of its outputs is a graph output or is read by a
 * live node.  The schedule is in SSA order, so a single backward sweep
 * decides liveness: by the time the sweep reaches a node, every node that
 * could read it has been decided.  kiln ops have no side effects (random
 * ops are pure functions of their seed), so nothing else keeps a node alive.
 * Graph inputs and parameters stay even when unused: they are the graph's
 * interface, and a state_dict names every parameter.
 */
#include <stdlib.h>

#include "passes/passes.h"

kiln_status pass_dce(kiln_graph *g, const pass_opts *o)
{
	bool *live = calloc(g->nval, sizeof *live);
	if (!live)
		return ir_errorf(g, NULL, KILN_ENOMEM, "dce: out of memory");
	for (uint32_t i = 0; i < g->noutput; i++)
		live[g->output[i]] = true;
	for (uint32_t i = g->nnode; i-- > 0;) {
		ir_node *n = g->node[i];
		if (n->dead)
			continue;
		bool used = false;
		for (uint32_t k = 0; k < n->nout && !used; k++)
			used = live[n->out[k]];
		if (!used) {
			ir_node_remove(g, n);
			continue;
		}
		for (uint32_t k = 0; k < n->nin; k++)
			live[n->in[k]] = true;
	}
	free(live);
	return ir_compact(g);
}
