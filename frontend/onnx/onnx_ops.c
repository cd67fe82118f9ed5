/*
 * onnx_ops.c: the per-op half of the ONNX importer: one function per op
 * whose ONNX form differs from kiln's, in a table indexed by kiln's op enum;
 * every other op maps one to one (inputs in order, attributes by schema).
 *
 * Most differences are ONNX moving a compile-time constant from an
 * attribute to an input at some opset (Reshape 5, Slice 10, Clip 11, Pad 11,
 * Dropout 12, Squeeze/Unsqueeze/Split/ReduceSum 13): from that opset on the
 * input must be a constant the importer knows, and it becomes the kiln
 * attribute of the same meaning; before it, the attribute copies over as
 * is.  The rest are legacy attributes (BatchNormalization's spatial, Gemm's
 * broadcast), Softmax's pre-13 "flatten to 2-D at axis" semantics,
 * Constant's value_* spellings, and Pow's mixed base/exponent dtypes.
 */
#include <string.h>

#include "frontend/onnx/onnx.h"

/* The opset from which each op takes these constants as inputs. */
enum { RESHAPE_INPUTS = 5, SLICE_INPUTS = 10, CLIP_INPUTS = 11, PAD_INPUTS = 11,
       DROPOUT_INPUTS = 12, AXES_INPUTS = 13, SOFTMAX_ANY_AXIS = 13,
       BN_TRAINING_MODE = 14 /* the attribute; before it, extra outputs */ };

static void generic(onnx_imp *c, onnx_nd *d)
{
	onnx_emit(c, d, (uint32_t)d->p->n_input, NULL);
}

/* A symbolic element equal to the input's dim at its place copies it (0);
 * one other unknown is inferred (-1).  allowzero=1 gives 0 no such role. */
static bool reshape_dims(onnx_imp *c, onnx_nd *d, const onnx_svec *s, int64_t *out)
{
	const ir_type *x = &c->g->val[d->n->in[0]]->type;
	bool copy = ir_attr_int(d->n, "allowzero", 0) == 0;
	int unknown = -1;
	for (int i = 0; i < s->n; i++) {
		out[i] = s->v[i];
		if (!s->sym[i] && s->v[i] == -1 && unknown < 0)
			unknown = i;
		else if (!s->sym[i])
			continue;
		else if (copy && i < x->rank && x->dim[i] == s->v[i])
			out[i] = 0;
		else if (unknown >= 0)
			return false;
		else
			out[unknown = i] = -1;
	}
	return true;
}

/* A symbolic element equal to the input's aligned dim keeps it (1); one
 * where the input has 1 or no dim broadcasts to the symbol itself (torch's
 * expand(N, -1, -1) of a class token). */
static bool expand_dims(onnx_imp *c, onnx_nd *d, const onnx_svec *s, int64_t *out)
{
	const ir_type *x = &c->g->val[d->n->in[0]]->type;
	for (int i = 0; i < s->n; i++) {
		int k = i - (s->n - x->rank);
		out[i] = s->v[i];
		if (s->sym[i] && k >= 0 && x->dim[k] == s->v[i])
			out[i] = 1;
		else if (s->sym[i] && k >= 0 && x->dim[k] != 1)
			return false;
	}
	return true;
}

static void reshape(onnx_imp *c, onnx_nd *d)
{
	if (c->opset < RESHAPE_INPUTS)
		onnx_emit(c, d, 1, NULL);
	else if (onnx_emit(c, d, 1, NULL))
		onnx_shape_input(c, d, 1, "shape", reshape_dims);
}

static void expand(onnx_imp *c, onnx_nd *d)
{
	if (onnx_emit(c, d, 1, NULL))
		onnx_shape_input(c, d, 1, "shape", expand_dims);
}

static void slice(onnx_imp *c, onnx_nd *d)
{
	if (!onnx_emit(c, d, 1, NULL) || c->opset < SLICE_INPUTS)
		return;
	if (onnx_dims_input(c, d, 1, "starts", true) && onnx_dims_input(c, d, 2, "ends", true) &&
	    onnx_ints_input(c, d, 3, "axes", false))
		onnx_ints_input(c, d, 4, "steps", false);
}

/* Squeeze, Unsqueeze, Split and ReduceSum: axes (or sizes) input from 13. */
static void axes_input(onnx_imp *c, onnx_nd *d)
{
	static const char *const what[KILN_OP_COUNT] = {
		[KILN_OP_SQUEEZE] = "axes", [KILN_OP_UNSQUEEZE] = "axes",
		[KILN_OP_REDUCE_SUM] = "axes", [KILN_OP_SPLIT] = "split",
	};
	if (onnx_emit(c, d, 1, NULL) && c->opset >= AXES_INPUTS)
		onnx_ints_input(c, d, 1, what[d->op], d->op == KILN_OP_UNSQUEEZE);
}

static void clip(onnx_imp *c, onnx_nd *d)
{
	if (onnx_emit(c, d, 1, NULL) && c->opset >= CLIP_INPUTS &&
	    onnx_float_input(c, d, 1, "min"))
		onnx_float_input(c, d, 2, "max");
}

static void pad(onnx_imp *c, onnx_nd *d)
{
	if (!onnx_emit(c, d, 1, NULL) || c->opset < PAD_INPUTS)
		return;
	if (d->p->n_input > 3 && *d->p->input[3])
		onnx_problem(c, d, KILN_EUNSUPPORTED, "the axes input (opset 18) is not supported");
	else if (onnx_ints_input(c, d, 1, "pads", true))
		onnx_float_input(c, d, 2, "value");
}

static void dropout(onnx_imp *c, onnx_nd *d)
{
	static const char *const legacy[] = {"is_test", NULL};
	if (onnx_emit(c, d, 1, legacy) && c->opset >= DROPOUT_INPUTS &&
	    onnx_float_input(c, d, 1, "ratio"))
		onnx_int_input(c, d, 2, "training_mode");
}

static void gemm(onnx_imp *c, onnx_nd *d)
{
	static const char *const legacy[] = {"broadcast", NULL};
	onnx_emit(c, d, (uint32_t)d->p->n_input, legacy);
}

/* Whether a node or the graph's outputs read the ONNX value name. */
static bool is_read(const Onnx__GraphProto *gp, const char *name)
{
	for (size_t i = 0; i < gp->n_node; i++)
		for (size_t k = 0; k < gp->node[i]->n_input; k++)
			if (gp->node[i]->input[k] && !strcmp(gp->node[i]->input[k], name))
				return true;
	for (size_t i = 0; i < gp->n_output; i++)
		if (gp->output[i]->name && !strcmp(gp->output[i]->name, name))
			return true;
	return false;
}

/* spatial=1 (per-channel statistics, the default) is all kiln does.  From
 * opset 14 the training_mode attribute says whether the batch's statistics
 * normalise and the running ones update (outputs 1 and 2); before it, a
 * node with outputs besides Y is in training mode, and its outputs 3 and 4
 * (the saved batch mean and variance, which PyTorch's exports name but
 * never read) are not computed: reading one is reported. */
static void batch_norm(onnx_imp *c, onnx_nd *d)
{
	static const char *const legacy[] = {"spatial", "is_test", "consumed_inputs", NULL};
	static const char *const saved[] = {"mean", "variance"};
	const Onnx__AttributeProto *sp = onnx_attr(d, "spatial");
	const Onnx__NodeProto *p = d->p;
	bool training = false;
	if (sp && sp->i == 0)
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "spatial=0 (per-element "
		                          "statistics) is not supported");
	for (size_t i = 1; c->opset < BN_TRAINING_MODE && i < p->n_output; i++) {
		if (!p->output[i] || !*p->output[i])
			continue;
		training = true;
		if (i >= 3 && is_read(c->m->graph, p->output[i]))
			return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "output %zu ('%s', the saved "
			                          "batch %s of opset %lld's training mode) is read; kiln "
			                          "computes Y and the running mean and variance only", i,
			                          p->output[i], saved[i - 3], (long long)c->opset);
	}
	Onnx__NodeProto q = *p; /* kiln's node has Y and the running stats */
	if (c->opset < BN_TRAINING_MODE && q.n_output > 3)
		q.n_output = 3;
	d->p = &q;
	bool ok = onnx_emit(c, d, (uint32_t)p->n_input, legacy);
	d->p = p;
	if (ok && training && ir_attr_set_int(c->g, d->n, "training_mode", 1))
		onnx_problem(c, d, KILN_ENOMEM, "out of memory");
}

/* Before opset 13, Softmax flattens its input to 2-D at axis (default 1)
 * and normalises each row: the same as kiln's softmax over the last axis
 * when axis is the last, else Flatten -> Softmax(axis=1) -> Reshape back. */
static void softmax(onnx_imp *c, onnx_nd *d)
{
	if (c->opset >= SOFTMAX_ANY_AXIS) {
		onnx_emit(c, d, 1, NULL);
		return;
	}
	uint32_t x = onnx_input(c, d, 0, true);
	if (!x)
		return;
	const ir_type *t = &c->g->val[x]->type;
	const Onnx__AttributeProto *a = onnx_attr(d, "axis");
	int64_t axis = a ? a->i : 1;
	axis = axis < 0 ? axis + t->rank : axis;
	if (axis == t->rank - 1 || t->rank == 0) {
		if (onnx_emit(c, d, 1, NULL) && ir_attr_set_int(c->g, d->n, "axis", -1))
			onnx_problem(c, d, KILN_ENOMEM, "out of memory");
		return;
	}
	if (!ir_type_concrete(t)) {
		char ty[256];
		onnx_problem(c, d, KILN_EUNSUPPORTED, "opset %lld coerces the input to 2-D at axis "
		             "%lld, which needs a concrete shape, not %s", (long long)c->opset,
		             (long long)axis, ir_type_str(c->g, t, ty, sizeof ty));
		return;
	}
	ir_node *f = onnx_extra(c, d, KILN_OP_FLATTEN, 1, &x, "flatten");
	if (!f || ir_attr_set_int(c->g, f, "axis", axis) || !onnx_infer(c, d, f))
		return;
	ir_node *s = onnx_extra(c, d, d->op, 1, &f->out[0], "softmax2d");
	if (!s || ir_attr_set_int(c->g, s, "axis", 1) || !onnx_infer(c, d, s))
		return;
	uint32_t s_out = s->out[0];
	if (!(d->n = onnx_extra(c, d, KILN_OP_RESHAPE, 1, &s_out, NULL)) ||
	    ir_attr_set_ints(c->g, d->n, "shape", (uint32_t)t->rank, t->dim))
		d->failed = true;
}

/* Constant's value, value_float(s), value_int(s) all become one tensor. */
static void constant(onnx_imp *c, onnx_nd *d)
{
	static const char *const all[] = {"value", "value_float", "value_floats", "value_int",
	                                  "value_ints", NULL};
	const Onnx__AttributeProto *a = NULL;
	int k = 0;
	for (; all[k] && !(a = onnx_attr(d, all[k])); k++)
		;
	if (!a || d->p->n_attribute != 1) {
		onnx_problem(c, d, KILN_EUNSUPPORTED, "needs exactly one of value, value_float(s), "
		             "value_int(s) (value_string(s) and sparse_value are not supported)");
		return;
	}
	if (!onnx_emit(c, d, 0, all))
		return;
	int64_t n = (int64_t)(k == 2 ? a->n_floats : a->n_ints);
	kiln_tensor *t = k == 0 ? NULL
	               : ir_tensor_new(c->g, k <= 2 ? KILN_F32 : KILN_I64, k % 2 ? 0 : 1, &n);
	for (int64_t i = 0; t && i < (k % 2 ? 1 : n); i++)
		if (k <= 2)
			((float *)t->data)[i] = k == 1 ? a->f : a->floats[i];
		else
			((int64_t *)t->data)[i] = k == 3 ? a->i : a->ints[i];
	kiln_error err = {0};
	if (k == 0 && a->t && onnx_tensor_read(a->t, c->dir, &t, &err)) {
		onnx_problem(c, d, err.code, "value: %s", err.msg);
		return;
	}
	if (!t || ir_attr_set_tensor(c->g, d->n, "value", t))
		onnx_problem(c, d, KILN_EINVAL, "value could not be read");
	if (k == 0 && t)
		kiln_tensor_free(t);
}

/* Pow with an integer base and a float exponent: the power is taken in
 * the exponent's float type and the result cast back to the base's
 * (2 ^ 0.5 is 1, not 2 ^ 0). */
static void pow_in_float(onnx_imp *c, onnx_nd *d, uint32_t *in)
{
	kiln_dtype base = c->g->val[in[0]]->type.dtype, fl = c->g->val[in[1]]->type.dtype;
	ir_node *cx = onnx_extra(c, d, KILN_OP_CAST, 1, &in[0], "cast_base");
	if (!cx || ir_attr_set_dtype(c->g, cx, "to", fl) || !onnx_infer(c, d, cx))
		return;
	uint32_t fin[2] = {cx->out[0], in[1]};
	ir_node *p = onnx_extra(c, d, KILN_OP_POW, 2, fin, "pow");
	if (!p || !onnx_infer(c, d, p))
		return;
	uint32_t y = p->out[0];
	if (!(d->n = onnx_extra(c, d, KILN_OP_CAST, 1, &y, NULL)) ||
	    ir_attr_set_dtype(c->g, d->n, "to", base))
		d->failed = true;
}

/* ONNX's Pow (opset 12+) lets the exponent's dtype differ from the base's
 * and returns the base's: an exponent of another float or integer type is
 * cast to the base's, as the result would be; a float exponent of an
 * integer base needs the power taken in floats. */
static void pow_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t in[2] = {onnx_input(c, d, 0, true), onnx_input(c, d, 1, true)};
	if (!in[0] || !in[1])
		return;
	kiln_dtype base = c->g->val[in[0]]->type.dtype, ex = c->g->val[in[1]]->type.dtype;
	if (ex != base && !kiln_dtype_is_float(base) && kiln_dtype_is_float(ex)) {
		pow_in_float(c, d, in);
		return;
	}
	if (ex != base) {
		ir_node *cast = onnx_extra(c, d, KILN_OP_CAST, 1, &in[1], "cast_exponent");
		if (!cast || ir_attr_set_dtype(c->g, cast, "to", base) || !onnx_infer(c, d, cast))
			return;
		in[1] = cast->out[0];
	}
	onnx_emit_with(c, d, 2, in, NULL);
}

/* MatMulInteger and ConvInteger: a zero point left out ("") before one
 * that is given becomes a constant 0 of its operand's dtype (inputs 2 and
 * 3 describe inputs 0 and 1). */
static void zero_points(onnx_imp *c, onnx_nd *d)
{
	uint32_t in[4] = {0}, nin = 0;
	for (uint32_t i = 0; i < d->p->n_input && i < 4; i++)
		if (d->p->input[i] && *d->p->input[i])
			nin = i + 1;
	for (uint32_t i = 0; i < nin; i++) {
		if ((in[i] = onnx_input(c, d, i, i < 2)) || d->failed)
			continue;
		if (i < 2)
			return;
		kiln_tensor *t = ir_tensor_new(c->g, c->g->val[in[i - 2]]->type.dtype, 0, NULL);
		ir_node *z = onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL,
		                        i == 2 ? "zero_point_a" : "zero_point_b");
		if (!t || !z || ir_attr_set_tensor(c->g, z, "value", t) || !onnx_infer(c, d, z))
			return (void)(d->failed = true);
		in[i] = z->out[0];
	}
	if (!d->failed)
		onnx_emit_with(c, d, nin, in, NULL);
}

/* Resize's sizes: a symbolic element is kept as the symbol (the shape rule
 * accepts it where it equals the input's dim: that axis is not resized). */
static bool resize_sizes(onnx_imp *c, onnx_nd *d, const onnx_svec *s, int64_t *out)
{
	(void)c, (void)d;
	for (int i = 0; i < s->n; i++)
		out[i] = s->v[i];
	return true;
}

/* Resize: opset 10 takes (X, scales) with Upsample's asymmetric
 * coordinates and floor for nearest; opset 11 on (X, roi, scales, sizes),
 * any of the last three absent or empty.  They become attributes; roi
 * only matters to tf_crop_and_resize. */
static void resize(onnx_imp *c, onnx_nd *d)
{
	if (!onnx_emit(c, d, 1, NULL))
		return;
	int si = c->opset < 11 ? 1 : 2;
	for (int i = c->opset < 11 ? 1 : 1; i <= si && !d->failed; i++) {
		bool roi = c->opset >= 11 && i == 1;
		uint32_t v = onnx_input(c, d, (uint32_t)i, false);
		if (!v || (roi && strcmp(ir_attr_str(d->n, "coordinate_transformation_mode",
		                                     "half_pixel"), "tf_crop_and_resize")))
			continue;
		const kiln_tensor *t = onnx_const_input(c, d, (uint32_t)i, roi ? "roi" : "scales",
		                                        false);
		int64_t cnt = t ? kiln_tensor_numel(t) : 0;
		double *f = cnt ? ir_alloc(c->g->arena, (size_t)cnt * sizeof *f) : NULL;
		for (int64_t k = 0; f && k < cnt; k++)
			f[k] = ir_load(t, k);
		if (cnt && (!f || ir_attr_set_floats(c->g, d->n, roi ? "roi" : "scales", (uint32_t)cnt, f)))
			onnx_problem(c, d, KILN_ENOMEM, "out of memory");
	}
	if (c->opset < 11) {
		if (ir_attr_set_string(c->g, d->n, "coordinate_transformation_mode", "asymmetric") ||
		    ir_attr_set_string(c->g, d->n, "nearest_mode", "floor"))
			onnx_problem(c, d, KILN_ENOMEM, "out of memory");
	} else if (onnx_input(c, d, 3, false) && !d->failed) {
		onnx_shape_input(c, d, 3, "sizes", resize_sizes);
	}
}

/* TopK: K is an attribute before opset 10, then a 1-element input. */
static void topk(onnx_imp *c, onnx_nd *d)
{
	if (!onnx_emit(c, d, 1, NULL) || c->opset < 10)
		return;
	const kiln_tensor *k = onnx_const_input(c, d, 1, "K", true);
	if (k && kiln_tensor_numel(k) != 1)
		onnx_problem(c, d, KILN_EINVAL, "K must hold one value");
	else if (k && ir_attr_set_int(c->g, d->n, "k", ir_load_i64(k, 0)))
		onnx_problem(c, d, KILN_ENOMEM, "out of memory");
}

const onnx_import_fn onnx_import_table[KILN_OP_COUNT] = {
	[KILN_OP_RESHAPE] = reshape, [KILN_OP_EXPAND] = expand, [KILN_OP_SLICE] = slice,
	[KILN_OP_SQUEEZE] = axes_input, [KILN_OP_UNSQUEEZE] = axes_input,
	[KILN_OP_SPLIT] = axes_input, [KILN_OP_REDUCE_SUM] = axes_input,
	[KILN_OP_CLIP] = clip, [KILN_OP_PAD] = pad, [KILN_OP_DROPOUT] = dropout,
	[KILN_OP_GEMM] = gemm, [KILN_OP_BATCH_NORM] = batch_norm,
	[KILN_OP_SOFTMAX] = softmax, [KILN_OP_LOG_SOFTMAX] = softmax,
	[KILN_OP_CONSTANT] = constant, [KILN_OP_POW] = pow_op,
	[KILN_OP_MATMUL_INTEGER] = zero_points, [KILN_OP_CONV_INTEGER] = zero_points,
	[KILN_OP_RESIZE] = resize, [KILN_OP_TOPK] = topk, [KILN_OP_RANGE] = onnx_import_range,
	[KILN_OP_RNN] = onnx_import_rnn, [KILN_OP_GRU] = onnx_import_gru, /* onnx_rnn.c */
	[KILN_OP_LSTM] = onnx_import_lstm,
};

/* Ops without an entry map one to one. */
void onnx_import_node(onnx_imp *c, onnx_nd *d)
{
	onnx_import_fn fn = onnx_import_table[d->op];
	(fn ? fn : generic)(c, d);
}
