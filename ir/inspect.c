/*
 * inspect.c: what kiln.h offers a client for reading a graph it did not
 * build: its parameters one by one, the op histogram of its nodes, its
 * types printed with its symbols, where its nodes came from, and tensor
 * elements of any dtype.  `kiln inspect`, `kiln run` and `kiln train` read
 * graphs through these alone (tools/ includes kiln.h and driver.h only).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

_Static_assert(KILN_OP_COUNT <= KILN_OP_KINDS, "KILN_OP_KINDS must cover every op");

static const ir_value *param_of(const kiln_graph *g, kiln_value p)
{
	return g && p && p < g->nval && g->val[p]->kind == IR_V_PARAM ? g->val[p] : NULL;
}

KILN_API int kiln_graph_num_params(const kiln_graph *g)
{
	int n = 0;
	for (uint32_t i = 1; g && i < g->nval; i++)
		n += g->val[i]->kind == IR_V_PARAM;
	return n;
}

KILN_API kiln_value kiln_graph_param(const kiln_graph *g, int i)
{
	for (uint32_t v = 1; g && i >= 0 && v < g->nval; v++)
		if (g->val[v]->kind == IR_V_PARAM && i-- == 0)
			return v;
	return KILN_NONE;
}

KILN_API bool kiln_param_trainable(const kiln_graph *g, kiln_value p)
{
	const ir_value *v = param_of(g, p);
	return v && v->trainable;
}

KILN_API kiln_tensor *kiln_param_data(const kiln_graph *g, kiln_value p)
{
	const ir_value *v = param_of(g, p);
	return v ? v->data : NULL;
}

KILN_API kiln_loc kiln_graph_loc(const kiln_graph *g)
{
	return ir_graph_loc(g);
}

KILN_API const char *kiln_type_str(const kiln_graph *g, kiln_dtype dt, int rank,
                                   const int64_t *dims, char *buf, size_t size)
{
	ir_type t = {.dtype = dt, .rank = rank};
	if (rank < 0 || rank > KILN_MAX_RANK || (rank && !dims)) {
		snprintf(buf, size, "?");
		return buf;
	}
	for (int i = 0; i < rank; i++)
		t.dim[i] = dims[i];
	return ir_type_str(g, &t, buf, size);
}

static int by_count(const void *a, const void *b)
{
	const kiln_op_count *x = a, *y = b;
	if (x->count != y->count)
		return y->count - x->count;
	return strcmp(x->op, y->op);
}

KILN_API int kiln_graph_op_histogram(const kiln_graph *g, kiln_op_count *out, int cap,
                                     int *nodes)
{
	kiln_op_count h[KILN_OP_COUNT];
	int live = 0, n = 0;
	for (int i = 0; i < KILN_OP_COUNT; i++)
		h[i] = (kiln_op_count){ir_op(i)->kir, 0};
	for (uint32_t i = 0; g && i < g->nnode; i++)
		if (!g->node[i]->dead) {
			h[g->node[i]->op].count++;
			live++;
		}
	qsort(h, KILN_OP_COUNT, sizeof *h, by_count);
	while (n < KILN_OP_COUNT && h[n].count)
		n++;
	for (int i = 0; out && i < n && i < cap; i++)
		out[i] = h[i];
	if (nodes)
		*nodes = live;
	return n;
}

KILN_API double kiln_tensor_get(const kiln_tensor *t, int64_t i)
{
	return ir_load(t, i);
}

KILN_API int64_t kiln_tensor_get_i64(const kiln_tensor *t, int64_t i)
{
	return ir_load_i64(t, i);
}
