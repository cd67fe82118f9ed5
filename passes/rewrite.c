/*
 * rewrite.c: what the rewriting passes (fold, canonicalize, cse, bnfold,
 * qfuse) share: reading a value's compile-time tensor, testing for a graph
 * output, making a Constant, copying a node's attributes.
 */
#include "passes/passes.h"

const kiln_tensor *pass_const_of(const kiln_graph *g, uint32_t v)
{
	const ir_value *x = g->val[v];
	if (x->kind != IR_V_NODE || !x->def || x->def->dead || x->def->op != KILN_OP_CONSTANT)
		return NULL;
	const ir_attr *a = ir_attr_get(x->def, "value");
	return a && a->kind == IR_A_TENSOR ? a->u.t : NULL;
}

const kiln_tensor *pass_fixed(const kiln_graph *g, uint32_t v)
{
	const ir_value *x = g->val[v];
	return x->kind == IR_V_PARAM ? x->data : pass_const_of(g, v);
}

bool pass_is_output(const kiln_graph *g, uint32_t v)
{
	for (uint32_t i = 0; i < g->noutput; i++)
		if (g->output[i] == v)
			return true;
	return false;
}

uint32_t pass_constant(kiln_graph *g, kiln_loc loc, const kiln_tensor *t)
{
	ir_node *c = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, loc);
	if (!c || ir_attr_set_tensor(g, c, "value", t) != KILN_OK || ir_infer_node(g, c) != KILN_OK)
		return 0;
	return c->out[0];
}

void pass_copy_attrs(kiln_graph *g, ir_node *dst, const ir_node *src)
{
	for (uint32_t i = 0; i < src->nattr; i++) {
		const ir_attr *a = &src->attr[i];
		switch (a->kind) {
		case IR_A_INT: ir_attr_set_int(g, dst, a->name, a->u.i); break;
		case IR_A_DTYPE: ir_attr_set_dtype(g, dst, a->name, (kiln_dtype)a->u.i); break;
		case IR_A_FLOAT: ir_attr_set_float(g, dst, a->name, a->u.f); break;
		case IR_A_INTS: ir_attr_set_dims(g, dst, a->name, a->n, a->u.ints, a->dims); break;
		case IR_A_FLOATS: ir_attr_set_floats(g, dst, a->name, a->n, a->u.floats); break;
		case IR_A_STRING: ir_attr_set_string(g, dst, a->name, a->u.s); break;
		case IR_A_TENSOR: ir_attr_set_tensor(g, dst, a->name, a->u.t); break;
		}
	}
}
