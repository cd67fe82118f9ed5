/*
 * onnx_compose.c: ONNX ops kiln imports as a few of its own, because they
 * are exactly that composition (ONNX's own function bodies or reference
 * formulas), so the interpreter, the lowering, the gradients and export get
 * them for nothing:
 *
 *   ReduceL1(x)         ReduceSum(Abs(x))
 *   ReduceL2(x)         Sqrt(ReduceSum(x * x))
 *   ReduceSumSquare(x)  ReduceSum(x * x)
 *   ReduceLogSum(x)     Log(ReduceSum(x))
 *   ReduceLogSumExp(x)  Log(ReduceSum(Exp(x - m))) + m, m = ReduceMax(x): no
 *                       overflow for large x
 *   ArgMin(x)           ArgMax(-x), ArgMax(-1 - x) for integers (no overflow:
 *                       a decreasing map keeps the first and last index)
 *
 * The reductions keep the node's axes, keepdims and noop_with_empty_axes.
 * Export writes the composition, which imports back to the same graph.
 */
#include <string.h>

#include "frontend/onnx/onnx.h"

/* An extra node op(in) with d's attributes of op's schema (copy), inferred;
 * its result, or 0 on a problem. */
static uint32_t step(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t nin, const uint32_t *in,
                     bool copy, const char *suffix)
{
	for (uint32_t i = 0; i < nin; i++)
		if (!in[i] || d->failed)
			return 0;
	ir_node *n = onnx_extra(c, d, op, nin, in, suffix);
	if (!n || (copy && !onnx_copy_attrs_to(c, d, n, op, NULL))) {
		d->failed = true;
		return 0;
	}
	if (!suffix) { /* d's own result: add_node infers it */
		d->n = n;
		return n->out[0];
	}
	return onnx_infer(c, d, n) ? n->out[0] : (d->failed = true, 0);
}

/* The reduction over d's axes of x (ReduceSum or ReduceMax); keep forces
 * keepdims=1. */
static uint32_t reduce(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t x, bool keep,
                       const char *suffix)
{
	if (!x || d->failed)
		return 0;
	static const char *const no_keepdims[] = {"keepdims", NULL}; /* default 1 */
	ir_node *n = onnx_extra(c, d, op, 1, &x, suffix);
	if (!n || !onnx_copy_attrs_to(c, d, n, op, keep ? no_keepdims : NULL)) {
		d->failed = true;
		return 0;
	}
	if (!suffix) {
		d->n = n;
		return n->out[0];
	}
	return onnx_infer(c, d, n) ? n->out[0] : (d->failed = true, 0);
}

static uint32_t square(onnx_imp *c, onnx_nd *d, uint32_t x)
{
	return step(c, d, KILN_OP_MUL, 2, (uint32_t[]){x, x}, false, "square");
}

static void reduce_l1(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	x = step(c, d, KILN_OP_ABS, 1, &x, false, "abs");
	reduce(c, d, KILN_OP_REDUCE_SUM, x, false, NULL);
}

static void reduce_l2(onnx_imp *c, onnx_nd *d)
{
	uint32_t s = reduce(c, d, KILN_OP_REDUCE_SUM, square(c, d, onnx_input(c, d, 0, true)), false,
	                    "sum");
	step(c, d, KILN_OP_SQRT, 1, &s, false, NULL);
}

static void reduce_sum_square(onnx_imp *c, onnx_nd *d)
{
	reduce(c, d, KILN_OP_REDUCE_SUM, square(c, d, onnx_input(c, d, 0, true)), false, NULL);
}

static void reduce_log_sum(onnx_imp *c, onnx_nd *d)
{
	uint32_t s = reduce(c, d, KILN_OP_REDUCE_SUM, onnx_input(c, d, 0, true), false, "sum");
	step(c, d, KILN_OP_LOG, 1, &s, false, NULL);
}

static void reduce_log_sum_exp(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	uint32_t mk = reduce(c, d, KILN_OP_REDUCE_MAX, x, true, "max_keep");
	uint32_t m = reduce(c, d, KILN_OP_REDUCE_MAX, x, false, "max");
	uint32_t e = step(c, d, KILN_OP_SUB, 2, (uint32_t[]){x, mk}, false, "shifted");
	e = step(c, d, KILN_OP_EXP, 1, &e, false, "exp");
	uint32_t s = reduce(c, d, KILN_OP_REDUCE_SUM, e, false, "sum");
	s = step(c, d, KILN_OP_LOG, 1, &s, false, "log");
	step(c, d, KILN_OP_ADD, 2, (uint32_t[]){s, m}, false, NULL);
}

static void argmin(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), neg = 0;
	if (!x)
		return;
	kiln_dtype dt = c->g->val[x]->type.dtype;
	if (kiln_dtype_is_float(dt)) {
		neg = step(c, d, KILN_OP_NEG, 1, &x, false, "neg");
	} else {
		kiln_tensor *t = ir_tensor_new(c->g, dt, 0, NULL);
		ir_node *k = t ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, "minus_one") : NULL;
		if (k)
			ir_store(t, 0, -1);
		if (!k || ir_attr_set_tensor(c->g, k, "value", t) || !onnx_infer(c, d, k))
			return (void)(d->failed = true);
		neg = step(c, d, KILN_OP_SUB, 2, (uint32_t[]){k->out[0], x}, false, "reversed");
	}
	step(c, d, KILN_OP_ARGMAX, 1, &neg, true, NULL);
}

static const struct {
	const char *name;
	void (*import)(onnx_imp *c, onnx_nd *d);
} composites[] = {
	{"ReduceL1", reduce_l1},
	{"ReduceL2", reduce_l2},
	{"ReduceSumSquare", reduce_sum_square},
	{"ReduceLogSum", reduce_log_sum},
	{"ReduceLogSumExp", reduce_log_sum_exp},
	{"ArgMin", argmin},
};

bool onnx_import_composite(onnx_imp *c, onnx_nd *d)
{
	for (size_t i = 0; d->p->op_type && i < sizeof composites / sizeof *composites; i++)
		if (!strcmp(d->p->op_type, composites[i].name)) {
			composites[i].import(c, d);
			return true;
		}
	return false;
}

bool onnx_op_imports(const char *domain, const char *op_type)
{
	if (!op_type)
		return false;
	if (domain && !strcmp(domain, "com.microsoft"))
		return onnx_msft_op(op_type);
	if (domain && *domain && strcmp(domain, "ai.onnx"))
		return false;
	for (size_t i = 0; i < sizeof composites / sizeof *composites; i++)
		if (!strcmp(op_type, composites[i].name))
			return true;
	return ir_op_from_onnx(op_type) != KILN_OP_COUNT;
}
