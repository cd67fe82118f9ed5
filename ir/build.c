/*
 * build.c: the IR's typed node builder, the tracing DSL's core: one builder
 * per op in kiln.h (the gradient rules and optimizer use them too), each appending a
 * node to the graph and returning its result's handle.
 *
 * Every builder is the same three steps: begin() checks the sticky error and
 * the operand handles and appends the node; the builder sets the node's
 * attributes exactly as ops.def names them; finish() runs shape inference
 * and, if anything failed, rolls the graph back to how it was before the
 * call.  The node's location is the caller's KILN_HERE, so an error from
 * shape.c reads "mnist.c:42: MatMul: inner dims differ: ..." with the user's
 * line, not ours.  Builders that trace several nodes (layer norm
 * without scale) take a mark and roll back to it, so a failed call never
 * leaves half a composite behind.
 *
 * Choices worth knowing: kiln_dropout_at with training=false traces nothing
 * and returns x (what PyTorch's exporter does in eval mode); in training mode
 * it traces Dropout with training_mode=1 and both outputs, the second being
 * the keep mask that the gradient rule needs.  kiln_param_at(NULL init)
 * makes an f32 scalar zero.  kiln_output_at inserts an Identity when the
 * value already has a name or is an input or parameter, so each graph output
 * carries exactly the requested name.
 */
#include <stdio.h>
#include <string.h>

#include "ir/build.h"

/* ---- marks, rollback and operand checks (shared with layers.c) -------- */

ir_mark ir_mark_of(const kiln_graph *g)
{
	return (ir_mark){g->nnode, g->nval, g->ninput, g->noutput};
}

void ir_rollback(kiln_graph *g, ir_mark m)
{
	/* newest first, so use lists of older values lose exactly our uses */
	while (g->nnode > m.nnode)
		ir_node_remove(g, g->node[--g->nnode]);
	for (uint32_t i = m.nval; i < g->nval; i++)
		g->val[i]->kind = IR_V_NONE;
	if (g->nval > m.nval)
		g->nval = m.nval;
	if (g->ninput > m.ninput)
		g->ninput = m.ninput;
	if (g->noutput > m.noutput)
		g->noutput = m.noutput;
}

const ir_value *ir_operand(kiln_graph *g, kiln_loc loc, const char *op, const char *what,
                         kiln_value v)
{
	if (v == KILN_NONE) {
		ir_errorf_at(g, loc, KILN_EINVAL, "%s: %s is KILN_NONE (did an earlier call fail?)",
		             op, what);
		return NULL;
	}
	const ir_value *p = ir_val(g, v);
	if (!p || p->kind == IR_V_NONE) {
		ir_errorf_at(g, loc, KILN_EINVAL, "%s: %s (handle %u) is not a value of graph '%s'",
		             op, what, (unsigned)v, g->name);
		return NULL;
	}
	return p;
}

bool ir_name_taken(const kiln_graph *g, const char *name)
{
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		if (v->kind != IR_V_NONE && v->name && strcmp(v->name, name) == 0)
			return true;
	}
	return false;
}

/* ---- the generic builder steps ----------------------------------------- */

static bool ready(const kiln_graph *g)
{
	return g && g->status == KILN_OK;
}

/* Checks operands and appends the node; NULL when anything failed. */
static ir_node *begin(kiln_graph *g, kiln_loc loc, kiln_op op, uint32_t nin,
                      const kiln_value *in, uint32_t nout)
{
	if (!ready(g))
		return NULL;
	if (op >= KILN_OP_COUNT) {
		ir_errorf_at(g, loc, KILN_EINVAL, "unknown op %d", (int)op);
		return NULL;
	}
	for (uint32_t i = 0; i < nin; i++) {
		char what[32];
		snprintf(what, sizeof what, "input %u", (unsigned)i);
		if (!ir_operand(g, loc, ir_op(op)->onnx, what, in[i]))
			return NULL;
	}
	return ir_node_new(g, op, nin, in, nout, loc);
}

/* Infers n's output types; on any error (attributes included) removes n
 * and its results, so the graph is as it was before begin(). */
static bool settle(kiln_graph *g, ir_node *n)
{
	if (!n)
		return false;
	if (g->status == KILN_OK) {
		kiln_status st = ir_infer_node(g, n);
		if (st != KILN_OK && g->status == KILN_OK)
			ir_errorf(g, n, st, "shape inference failed");
	}
	if (g->status == KILN_OK)
		return true;
	ir_rollback(g, (ir_mark){n->idx, n->out[0], g->ninput, g->noutput});
	return false;
}

static kiln_value finish(kiln_graph *g, ir_node *n)
{
	return settle(g, n) ? n->out[0] : KILN_NONE;
}

static const ir_type *type_of(const kiln_graph *g, kiln_value v)
{
	return &g->val[v]->type;
}

/* ---- elementwise -------------------------------------------------------- */

static kiln_value unary(kiln_graph *g, kiln_loc loc, kiln_op op, kiln_value x)
{
	return finish(g, begin(g, loc, op, 1, &x, 1));
}

static kiln_value binary(kiln_graph *g, kiln_loc loc, kiln_op op, kiln_value a, kiln_value b)
{
	return finish(g, begin(g, loc, op, 2, (kiln_value[]){a, b}, 1));
}

/* kiln.h's op names are the .kir mnemonics, so the op comes from the table */
#define DEF_UNARY(name)                                                              \
	KILN_API kiln_value kiln_##name##_at(kiln_graph *g, kiln_loc loc, kiln_value x) \
	{                                                                            \
		return unary(g, loc, ir_op_from_kir(#name), x);                      \
	}
#define DEF_BINARY(name)                                                          \
	KILN_API kiln_value kiln_##name##_at(kiln_graph *g, kiln_loc loc, kiln_value a, \
	                                     kiln_value b)                        \
	{                                                                         \
		return binary(g, loc, ir_op_from_kir(#name), a, b);               \
	}
KILN_UNARY_OPS(DEF_UNARY)
KILN_BINARY_OPS(DEF_BINARY)

KILN_API kiln_value kiln_leaky_relu_at(kiln_graph *g, kiln_loc loc, kiln_value x, double alpha)
{
	ir_node *n = begin(g, loc, KILN_OP_LEAKY_RELU, 1, &x, 1);
	if (n)
		ir_attr_set_float(g, n, "alpha", alpha);
	return finish(g, n);
}

KILN_API kiln_value kiln_gelu_at(kiln_graph *g, kiln_loc loc, kiln_value x, bool tanh_approx)
{
	ir_node *n = begin(g, loc, KILN_OP_GELU, 1, &x, 1);
	if (n)
		ir_attr_set_string(g, n, "approximate", tanh_approx ? "tanh" : "none");
	return finish(g, n);
}

KILN_API kiln_value kiln_clip_at(kiln_graph *g, kiln_loc loc, kiln_value x, double lo, double hi)
{
	ir_node *n = begin(g, loc, KILN_OP_CLIP, 1, &x, 1);
	if (n) {
		ir_attr_set_float(g, n, "min", lo);
		ir_attr_set_float(g, n, "max", hi);
	}
	return finish(g, n);
}

KILN_API kiln_value kiln_cast_at(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype to)
{
	ir_node *n = begin(g, loc, KILN_OP_CAST, 1, &x, 1);
	if (n && kiln_dtype_size(to) == 0)
		ir_errorf(g, n, KILN_EINVAL, "cast to invalid dtype %d", (int)to);
	else if (n)
		ir_attr_set_dtype(g, n, "to", to);
	return finish(g, n);
}

KILN_API kiln_value kiln_where_at(kiln_graph *g, kiln_loc loc, kiln_value cond, kiln_value a,
                                  kiln_value b)
{
	return finish(g, begin(g, loc, KILN_OP_WHERE, 3, (kiln_value[]){cond, a, b}, 1));
}

/* ---- reductions ---------------------------------------------------------- */

static kiln_value reduce(kiln_graph *g, kiln_loc loc, kiln_op op, kiln_value x, int naxes,
                         const int64_t *axes, bool keepdims)
{
	ir_node *n = begin(g, loc, op, 1, &x, 1);
	if (!n)
		return KILN_NONE;
	if (naxes < 0 || naxes > KILN_MAX_RANK || (naxes && !axes))
		ir_errorf(g, n, KILN_EINVAL, "bad axes list (%d axes)", naxes);
	else if (naxes) /* no axes attribute: reduce over all axes */
		ir_attr_set_ints(g, n, "axes", (uint32_t)naxes, axes);
	ir_attr_set_int(g, n, "keepdims", keepdims);
	return finish(g, n);
}

KILN_API kiln_value kiln_reduce_sum_at(kiln_graph *g, kiln_loc loc, kiln_value x, int naxes,
                                       const int64_t *axes, bool keepdims)
{
	return reduce(g, loc, KILN_OP_REDUCE_SUM, x, naxes, axes, keepdims);
}

KILN_API kiln_value kiln_reduce_mean_at(kiln_graph *g, kiln_loc loc, kiln_value x, int naxes,
                                        const int64_t *axes, bool keepdims)
{
	return reduce(g, loc, KILN_OP_REDUCE_MEAN, x, naxes, axes, keepdims);
}

KILN_API kiln_value kiln_reduce_max_at(kiln_graph *g, kiln_loc loc, kiln_value x, int naxes,
                                       const int64_t *axes, bool keepdims)
{
	return reduce(g, loc, KILN_OP_REDUCE_MAX, x, naxes, axes, keepdims);
}

KILN_API kiln_value kiln_argmax_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis,
                                   bool keepdims)
{
	ir_node *n = begin(g, loc, KILN_OP_ARGMAX, 1, &x, 1);
	if (n) {
		ir_attr_set_int(g, n, "axis", axis);
		ir_attr_set_int(g, n, "keepdims", keepdims);
	}
	return finish(g, n);
}

/* ---- linear algebra ------------------------------------------------------ */

KILN_API kiln_value kiln_matmul_at(kiln_graph *g, kiln_loc loc, kiln_value a, kiln_value b)
{
	return binary(g, loc, KILN_OP_MATMUL, a, b);
}

KILN_API kiln_value kiln_gemm_at(kiln_graph *g, kiln_loc loc, kiln_value a, kiln_value b,
                                 kiln_value c, double alpha, double beta, bool trans_a,
                                 bool trans_b)
{
	ir_node *n = begin(g, loc, KILN_OP_GEMM, c ? 3 : 2, (kiln_value[]){a, b, c}, 1);
	if (n) {
		ir_attr_set_float(g, n, "alpha", alpha);
		ir_attr_set_float(g, n, "beta", beta);
		ir_attr_set_int(g, n, "transA", trans_a);
		ir_attr_set_int(g, n, "transB", trans_b);
	}
	return finish(g, n);
}

/* ---- convolution and pooling --------------------------------------------- */

static int64_t or1(int64_t v)
{
	return v ? v : 1;
}

/* strides, pads, dilations for nsp spatial dims; false (error recorded) on
 * a negative field, which no default could make sense of */
static bool geometry(kiln_graph *g, ir_node *n, const kiln_conv_opts *o, int nsp, bool dil)
{
	int64_t s[3], d[3], p[6];
	for (int i = 0; i < nsp; i++) {
		s[i] = or1(o->stride[i]);
		d[i] = or1(o->dilation[i]);
		p[i] = o->pad[i];
		p[nsp + i] = o->pad[nsp + i];
		if (s[i] < 0 || d[i] < 0 || p[i] < 0 || p[nsp + i] < 0 || o->group < 0) {
			ir_errorf(g, n, KILN_EINVAL, "negative stride, dilation, pad or group");
			return false;
		}
	}
	ir_attr_set_ints(g, n, "strides", nsp, s);
	ir_attr_set_ints(g, n, "pads", 2 * nsp, p);
	if (dil)
		ir_attr_set_ints(g, n, "dilations", nsp, d);
	return true;
}

/* Conv and ConvTranspose: the kernel comes from w's trailing dims. */
static void conv_attrs(kiln_graph *g, ir_node *n, const kiln_conv_opts *o)
{
	static const kiln_conv_opts dflt;
	const ir_type *wt = type_of(g, n->in[1]);
	int nsp = wt->rank - 2;
	char buf[256];
	if (nsp < 1 || nsp > 3) {
		ir_errorf(g, n, KILN_ESHAPE, "weight %s needs 1 to 3 spatial dims after [out, in]",
		          ir_type_str(g, wt, buf, sizeof buf));
		return;
	}
	o = o ? o : &dflt;
	int64_t k[3];
	bool known = true;
	for (int i = 0; i < nsp; i++) {
		k[i] = wt->dim[2 + i];
		known &= k[i] >= 0;
		if (o->kernel[i] && k[i] >= 0 && o->kernel[i] != k[i]) {
			ir_errorf(g, n, KILN_ESHAPE, "kernel[%d] = %lld but weight is %s", i,
			          (long long)o->kernel[i], ir_type_str(g, wt, buf, sizeof buf));
			return;
		}
	}
	if (!geometry(g, n, o, nsp, true))
		return;
	if (known) /* a symbolic kernel is left for shape inference to read from w */
		ir_attr_set_ints(g, n, "kernel_shape", nsp, k);
	ir_attr_set_int(g, n, "group", or1(o->group));
	if (n->op == KILN_OP_CONV_TRANSPOSE)
		ir_attr_set_ints(g, n, "output_padding", nsp, o->output_padding);
}

static kiln_value conv(kiln_graph *g, kiln_loc loc, kiln_op op, kiln_value x, kiln_value w,
                       kiln_value b, const kiln_conv_opts *o)
{
	ir_node *n = begin(g, loc, op, b ? 3 : 2, (kiln_value[]){x, w, b}, 1);
	if (n)
		conv_attrs(g, n, o);
	return finish(g, n);
}

KILN_API kiln_value kiln_conv_at(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_value w,
                                 kiln_value b, const kiln_conv_opts *o)
{
	return conv(g, loc, KILN_OP_CONV, x, w, b, o);
}

KILN_API kiln_value kiln_conv_transpose_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                           kiln_value w, kiln_value b, const kiln_conv_opts *o)
{
	return conv(g, loc, KILN_OP_CONV_TRANSPOSE, x, w, b, o);
}

static void pool_attrs(kiln_graph *g, ir_node *n, const kiln_conv_opts *o)
{
	const ir_type *xt = type_of(g, n->in[0]);
	int nsp = xt->rank - 2;
	char buf[256];
	if (nsp < 1 || nsp > 3) {
		ir_errorf(g, n, KILN_ESHAPE, "input %s is not [N, C, 1 to 3 spatial dims]",
		          ir_type_str(g, xt, buf, sizeof buf));
		return;
	}
	for (int i = 0; o && i < nsp; i++)
		if (o->kernel[i] <= 0)
			o = NULL;
	if (!o) {
		ir_errorf(g, n, KILN_EINVAL, "needs a positive kernel size for each of %d spatial dims",
		          nsp);
		return;
	}
	if (!geometry(g, n, o, nsp, n->op == KILN_OP_MAX_POOL))
		return;
	ir_attr_set_ints(g, n, "kernel_shape", nsp, o->kernel);
	ir_attr_set_int(g, n, "ceil_mode", o->ceil_mode);
	if (n->op == KILN_OP_AVERAGE_POOL)
		ir_attr_set_int(g, n, "count_include_pad", o->count_include_pad);
}

KILN_API kiln_value kiln_max_pool_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                     const kiln_conv_opts *o)
{
	ir_node *n = begin(g, loc, KILN_OP_MAX_POOL, 1, &x, 1);
	if (n)
		pool_attrs(g, n, o);
	return finish(g, n);
}

KILN_API kiln_value kiln_avg_pool_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                     const kiln_conv_opts *o)
{
	ir_node *n = begin(g, loc, KILN_OP_AVERAGE_POOL, 1, &x, 1);
	if (n)
		pool_attrs(g, n, o);
	return finish(g, n);
}

KILN_API kiln_value kiln_global_avg_pool_at(kiln_graph *g, kiln_loc loc, kiln_value x)
{
	return unary(g, loc, KILN_OP_GLOBAL_AVERAGE_POOL, x);
}

/* ---- normalisation ------------------------------------------------------- */

KILN_API kiln_value kiln_batch_norm_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                       kiln_value scale, kiln_value bias, kiln_value mean,
                                       kiln_value var, double eps)
{
	ir_node *n = begin(g, loc, KILN_OP_BATCH_NORM, 5,
	                   (kiln_value[]){x, scale, bias, mean, var}, 1);
	if (n)
		ir_attr_set_float(g, n, "epsilon", eps);
	return finish(g, n);
}

/* A constant of ones shaped like x's dims from axis on: LayerNormalization
 * requires a scale input even when the caller has none. */
static kiln_value ones_tail(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis)
{
	const ir_value *p = ir_operand(g, loc, "LayerNormalization", "input 0", x);
	if (!p)
		return KILN_NONE;
	const ir_type *t = &p->type;
	int64_t a = axis < 0 ? axis + t->rank : axis;
	bool ok = a >= 0 && a < t->rank;
	for (int64_t i = a; ok && i < t->rank; i++)
		ok = t->dim[i] >= 0;
	char buf[256];
	if (!ok) {
		ir_errorf_at(g, loc, KILN_ESHAPE,
		             "LayerNormalization: without a scale, axis %lld of %s must be valid "
		             "and the normalised dims fixed", (long long)axis,
		             ir_type_str(g, t, buf, sizeof buf));
		return KILN_NONE;
	}
	kiln_tensor *one = kiln_tensor_new(t->dtype, (int)(t->rank - a), t->dim + a);
	if (!one) {
		ir_errorf_at(g, loc, KILN_ENOMEM, "LayerNormalization: out of memory");
		return KILN_NONE;
	}
	for (int64_t i = 0; i < kiln_tensor_numel(one); i++)
		ir_store(one, i, 1.0);
	kiln_value c = kiln_constant_at(g, loc, one);
	kiln_tensor_free(one);
	return c;
}

KILN_API kiln_value kiln_layer_norm_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                       kiln_value scale, kiln_value bias, int64_t axis,
                                       double eps)
{
	if (!ready(g))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	if (!scale)
		scale = ones_tail(g, loc, x, axis);
	ir_node *n = begin(g, loc, KILN_OP_LAYER_NORM, bias ? 3 : 2, (kiln_value[]){x, scale, bias}, 1);
	if (n) {
		ir_attr_set_int(g, n, "axis", axis);
		ir_attr_set_float(g, n, "epsilon", eps);
	}
	kiln_value y = finish(g, n);
	if (!y)
		ir_rollback(g, m);
	return y;
}

KILN_API kiln_value kiln_softmax_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis)
{
	ir_node *n = begin(g, loc, KILN_OP_SOFTMAX, 1, &x, 1);
	if (n)
		ir_attr_set_int(g, n, "axis", axis);
	return finish(g, n);
}

KILN_API kiln_value kiln_log_softmax_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis)
{
	ir_node *n = begin(g, loc, KILN_OP_LOG_SOFTMAX, 1, &x, 1);
	if (n)
		ir_attr_set_int(g, n, "axis", axis);
	return finish(g, n);
}

KILN_API kiln_value kiln_dropout_at(kiln_graph *g, kiln_loc loc, kiln_value x, double p,
                                    bool training, uint64_t seed)
{
	if (!ready(g) || !ir_operand(g, loc, "Dropout", "input 0", x))
		return KILN_NONE;
	if (!(p >= 0 && p < 1)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Dropout: ratio %g is not in [0, 1)", p);
		return KILN_NONE;
	}
	if (!training) /* inference: the identity, traced as nothing */
		return x;
	ir_node *n = begin(g, loc, KILN_OP_DROPOUT, 1, &x, 2);
	if (n) {
		ir_attr_set_float(g, n, "ratio", p);
		ir_attr_set_int(g, n, "training_mode", 1);
		ir_attr_set_int(g, n, "seed", (int64_t)seed);
	}
	return finish(g, n);
}

/* ---- shape ops ------------------------------------------------------------ */

/* An ints attribute from a caller's array of cnt entries (cnt may be 0). */
static bool ints_attr(kiln_graph *g, ir_node *n, const char *name, int cnt, const int64_t *v,
                      int max)
{
	if (cnt < 0 || cnt > max || (cnt && !v)) {
		ir_errorf(g, n, KILN_EINVAL, "bad %s list (%d entries)", name, cnt);
		return false;
	}
	return ir_attr_set_ints(g, n, name, (uint32_t)cnt, v) == KILN_OK;
}

KILN_API kiln_value kiln_reshape_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                    const int64_t *dims)
{
	ir_node *n = begin(g, loc, KILN_OP_RESHAPE, 1, &x, 1);
	if (n)
		ints_attr(g, n, "shape", rank, dims, KILN_MAX_RANK);
	return finish(g, n);
}

KILN_API kiln_value kiln_transpose_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                      const int64_t *perm)
{
	ir_node *n = begin(g, loc, KILN_OP_TRANSPOSE, 1, &x, 1);
	if (n && (rank || perm)) /* no perm: reverse the axes, as ONNX */
		ints_attr(g, n, "perm", rank, perm, KILN_MAX_RANK);
	return finish(g, n);
}

KILN_API kiln_value kiln_concat_at(kiln_graph *g, kiln_loc loc, int n, const kiln_value *xs,
                                   int64_t axis)
{
	if (ready(g) && (n < 1 || n > IR_VARIADIC || !xs)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Concat: needs 1 to %d inputs, got %d", IR_VARIADIC, n);
		return KILN_NONE;
	}
	ir_node *nd = begin(g, loc, KILN_OP_CONCAT, (uint32_t)n, xs, 1);
	if (nd)
		ir_attr_set_int(g, nd, "axis", axis);
	return finish(g, nd);
}

KILN_API kiln_status kiln_split_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis,
                                   int n, const int64_t *sizes, kiln_value *out)
{
	for (int i = 0; out && i < n; i++)
		out[i] = KILN_NONE;
	if (ready(g) && (n < 1 || n > IR_VARIADIC || !out))
		return ir_errorf_at(g, loc, KILN_EINVAL, "Split: needs 1 to %d outputs and an out "
		                    "array, got %d", IR_VARIADIC, n);
	ir_node *nd = begin(g, loc, KILN_OP_SPLIT, 1, &x, (uint32_t)n);
	if (nd) {
		ir_attr_set_int(g, nd, "axis", axis);
		if (sizes) /* none: equal parts, as many as outputs */
			ir_attr_set_ints(g, nd, "split", (uint32_t)n, sizes);
	}
	if (!settle(g, nd))
		return g ? g->status : KILN_EINVAL;
	for (int i = 0; i < n; i++)
		out[i] = nd->out[i];
	return KILN_OK;
}

KILN_API kiln_value kiln_slice_at(kiln_graph *g, kiln_loc loc, kiln_value x, int n,
                                  const int64_t *starts, const int64_t *ends,
                                  const int64_t *axes, const int64_t *steps)
{
	ir_node *nd = begin(g, loc, KILN_OP_SLICE, 1, &x, 1);
	if (nd && ints_attr(g, nd, "starts", n, starts, KILN_MAX_RANK) &&
	    ints_attr(g, nd, "ends", n, ends, KILN_MAX_RANK)) {
		if (axes)
			ir_attr_set_ints(g, nd, "axes", (uint32_t)n, axes);
		if (steps)
			ir_attr_set_ints(g, nd, "steps", (uint32_t)n, steps);
	}
	return finish(g, nd);
}

KILN_API kiln_value kiln_gather_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                   kiln_value indices, int64_t axis)
{
	ir_node *n = begin(g, loc, KILN_OP_GATHER, 2, (kiln_value[]){x, indices}, 1);
	if (n)
		ir_attr_set_int(g, n, "axis", axis);
	return finish(g, n);
}

KILN_API kiln_value kiln_flatten_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis)
{
	ir_node *n = begin(g, loc, KILN_OP_FLATTEN, 1, &x, 1);
	if (n)
		ir_attr_set_int(g, n, "axis", axis);
	return finish(g, n);
}

KILN_API kiln_value kiln_squeeze_at(kiln_graph *g, kiln_loc loc, kiln_value x, int n,
                                    const int64_t *axes)
{
	ir_node *nd = begin(g, loc, KILN_OP_SQUEEZE, 1, &x, 1);
	if (nd && n) /* no axes: every size-1 axis */
		ints_attr(g, nd, "axes", n, axes, KILN_MAX_RANK);
	return finish(g, nd);
}

KILN_API kiln_value kiln_unsqueeze_at(kiln_graph *g, kiln_loc loc, kiln_value x, int n,
                                      const int64_t *axes)
{
	ir_node *nd = begin(g, loc, KILN_OP_UNSQUEEZE, 1, &x, 1);
	if (nd)
		ints_attr(g, nd, "axes", n, axes, KILN_MAX_RANK);
	return finish(g, nd);
}

KILN_API kiln_value kiln_expand_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                   const int64_t *dims)
{
	ir_node *n = begin(g, loc, KILN_OP_EXPAND, 1, &x, 1);
	if (n)
		ints_attr(g, n, "shape", rank, dims, KILN_MAX_RANK);
	return finish(g, n);
}

KILN_API kiln_value kiln_pad_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                const int64_t *pads, const char *mode, double value)
{
	ir_node *n = begin(g, loc, KILN_OP_PAD, 1, &x, 1);
	if (n && ints_attr(g, n, "pads", 2 * rank, pads, 2 * KILN_MAX_RANK)) {
		ir_attr_set_string(g, n, "mode", mode ? mode : "constant");
		ir_attr_set_float(g, n, "value", value);
	}
	return finish(g, n);
}

KILN_API kiln_value kiln_shape_of_at(kiln_graph *g, kiln_loc loc, kiln_value x)
{
	return unary(g, loc, KILN_OP_SHAPE, x);
}

/* ---- losses ---------------------------------------------------------------- */

static bool reduction_ok(const char *r)
{
	return !strcmp(r, "mean") || !strcmp(r, "sum") || !strcmp(r, "none");
}

static kiln_value loss(kiln_graph *g, kiln_loc loc, kiln_op op, kiln_value x, kiln_value t,
                       kiln_value w, const char *reduction, bool has_ignore, int64_t ignore)
{
	ir_node *n = begin(g, loc, op, w ? 3 : 2, (kiln_value[]){x, t, w}, 1);
	reduction = reduction ? reduction : "mean";
	if (n && !reduction_ok(reduction))
		ir_errorf(g, n, KILN_EINVAL, "reduction '%s' is not mean, sum or none", reduction);
	else if (n) {
		ir_attr_set_string(g, n, "reduction", reduction);
		if (has_ignore)
			ir_attr_set_int(g, n, "ignore_index", ignore);
	}
	return finish(g, n);
}

KILN_API kiln_value kiln_softmax_cross_entropy_at(kiln_graph *g, kiln_loc loc,
                                                  kiln_value logits, kiln_value target,
                                                  kiln_value weight, const char *reduction,
                                                  bool has_ignore, int64_t ignore_index)
{
	return loss(g, loc, KILN_OP_SOFTMAX_CE, logits, target, weight, reduction, has_ignore,
	            ignore_index);
}

KILN_API kiln_value kiln_nll_loss_at(kiln_graph *g, kiln_loc loc, kiln_value logp,
                                     kiln_value target, kiln_value weight,
                                     const char *reduction, bool has_ignore,
                                     int64_t ignore_index)
{
	return loss(g, loc, KILN_OP_NLL_LOSS, logp, target, weight, reduction, has_ignore,
	            ignore_index);
}

/* ---- graph inputs, outputs, parameters and constants ---------------------- */

/* Records EINVAL unless name is a fresh, non-empty value name. */
static bool fresh_name(kiln_graph *g, kiln_loc loc, const char *what, const char *name)
{
	if (!name || !*name)
		ir_errorf_at(g, loc, KILN_EINVAL, "%s: a name is required", what);
	else if (ir_name_taken(g, name))
		ir_errorf_at(g, loc, KILN_EINVAL, "%s: the name '%s' is already used in graph '%s'",
		             what, name, g->name);
	return g->status == KILN_OK;
}

KILN_API kiln_value kiln_input_at(kiln_graph *g, kiln_loc loc, const char *name,
                                  kiln_dtype dt, int rank, const int64_t *dims)
{
	if (!ready(g) || !fresh_name(g, loc, "Input", name))
		return KILN_NONE;
	if (kiln_dtype_size(dt) == 0 || rank < 0 || rank > KILN_MAX_RANK || (rank && !dims)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Input '%s': bad dtype %d or rank %d", name, (int)dt,
		             rank);
		return KILN_NONE;
	}
	ir_type t = {dt, rank, {0}};
	for (int i = 0; i < rank; i++) {
		if (dims[i] < 0 && !ir_dim_expr(g, dims[i])) {
			ir_errorf_at(g, loc, KILN_EINVAL, "Input '%s': dim %d (%lld) is neither a size "
			             "nor a kiln_sym() handle", name, i, (long long)dims[i]);
			return KILN_NONE;
		}
		t.dim[i] = dims[i];
	}
	kiln_value v = ir_input_new(g, name, &t);
	if (!v)
		ir_errorf_at(g, loc, KILN_ENOMEM, "Input '%s': out of memory", name);
	return v;
}

KILN_API void kiln_output_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value v)
{
	if (!ready(g))
		return;
	const ir_value *p = ir_operand(g, loc, "Output", "value", v);
	if (!p || !fresh_name(g, loc, "Output", name))
		return;
	ir_mark m = ir_mark_of(g);
	/* a value has one name: an input, a parameter or an already named
	 * output gets an Identity whose result carries the new name */
	if (p->kind != IR_V_NODE || p->name)
		v = kiln_identity_at(g, loc, v);
	if (v && ir_output_add(g, v, name) != KILN_OK)
		ir_errorf_at(g, loc, KILN_ENOMEM, "Output '%s': out of memory", name);
	if (g->status != KILN_OK)
		ir_rollback(g, m);
}

KILN_API kiln_value kiln_param_at(kiln_graph *g, kiln_loc loc, const char *name,
                                  const kiln_tensor *init)
{
	if (!ready(g) || !fresh_name(g, loc, "Parameter", name))
		return KILN_NONE;
	kiln_tensor zero = {KILN_F32, 0, {0}, &(float){0}};
	init = init ? init : &zero;
	if (kiln_dtype_size(init->dtype) == 0 || init->rank < 0 || init->rank > KILN_MAX_RANK ||
	    !init->data) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Parameter '%s': invalid tensor", name);
		return KILN_NONE;
	}
	kiln_value v = ir_param_new(g, name, init, true);
	if (!v)
		ir_errorf_at(g, loc, KILN_ENOMEM, "Parameter '%s': out of memory or bad shape", name);
	return v;
}

KILN_API kiln_value kiln_buffer_at(kiln_graph *g, kiln_loc loc, const char *name,
                                   const kiln_tensor *init)
{
	if (!ready(g) || !fresh_name(g, loc, "Buffer", name))
		return KILN_NONE;
	if (!init || kiln_dtype_size(init->dtype) == 0 || init->rank < 0 ||
	    init->rank > KILN_MAX_RANK || !init->data) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Buffer '%s': invalid tensor", name);
		return KILN_NONE;
	}
	kiln_value v = ir_param_new(g, name, init, false);
	if (!v)
		ir_errorf_at(g, loc, KILN_ENOMEM, "Buffer '%s': out of memory or bad shape", name);
	return v;
}

KILN_API kiln_value kiln_constant_at(kiln_graph *g, kiln_loc loc, const kiln_tensor *t)
{
	if (ready(g) && (!t || kiln_dtype_size(t->dtype) == 0 || t->rank < 0 ||
	                 t->rank > KILN_MAX_RANK || !t->data)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Constant: invalid tensor");
		return KILN_NONE;
	}
	ir_node *n = begin(g, loc, KILN_OP_CONSTANT, 0, NULL, 1);
	if (n)
		ir_attr_set_tensor(g, n, "value", t);
	return finish(g, n);
}

KILN_API kiln_value kiln_scalar_at(kiln_graph *g, kiln_loc loc, kiln_dtype dt, double v)
{
	if (!ready(g))
		return KILN_NONE;
	kiln_tensor *t = kiln_tensor_new(dt, 0, NULL);
	if (!t) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Constant: bad dtype %d for a scalar", (int)dt);
		return KILN_NONE;
	}
	ir_store(t, 0, v);
	kiln_value c = kiln_constant_at(g, loc, t);
	kiln_tensor_free(t);
	return c;
}
