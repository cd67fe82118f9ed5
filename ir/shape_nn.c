/*
 * shape_nn.c: shape inference for the neural-network ops: MatMul and Gemm,
 * the window geometry of Conv, ConvTranspose and the pools, batch and layer
 * normalisation, softmax, dropout, and the NLL and softmax cross-entropy
 * losses.
 *
 * They are separate from shape.c because their rules are long and share a
 * vocabulary of their own (kernel, stride, dilation and padding read into a
 * geom, channel and group checks, loss reductions) that the element-wise and
 * movement rules never need.  The conventions are shape.c's: dims compare
 * with ==, new ones come from ir_dim_add/mul/div, and a rule that would need
 * a concrete value of a symbolic dim says KILN_EUNSUPPORTED.  The rules are
 * registered in ir_shape_table in shape.c through ir/shape.h.
 */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/shape.h"

static kiln_status need_dtype(kiln_graph *g, const ir_node *n, const ir_type *in, int i,
                              kiln_dtype want, const char *what)
{
	if (in[i].dtype != want) {
		tbuf a, b;
		FAIL(KILN_ESHAPE, "%s must have dtype %s like %s, got %s", what,
		     kiln_dtype_name(want), TS(&in[0], a), TS(&in[i], b));
	}
	return KILN_OK;
}

static kiln_status need_rank(kiln_graph *g, const ir_node *n, const ir_type *t, int lo, int hi,
                             const char *what)
{
	if (t->rank < lo || t->rank > hi) {
		tbuf b;
		if (lo == hi)
			FAIL(KILN_ESHAPE, "%s must have rank %d, got %s", what, lo, TS(t, b));
		FAIL(KILN_ESHAPE, "%s must have rank %d to %d, got %s", what, lo, hi, TS(t, b));
	}
	return KILN_OK;
}

/* ---- linear algebra ------------------------------------------------------ */

/* NumPy matmul: 1-D operands get a unit dim that is dropped again, the
 * leading (batch) dims broadcast. */
kiln_status ir_shape_matmul(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *a = &in[0], *b = &in[1];
	tbuf x, y;
	if (a->dtype != b->dtype)
		FAIL(KILN_ESHAPE, "dtypes differ: %s vs %s", TS(a, x), TS(b, y));
	if (a->rank < 1 || b->rank < 1)
		FAIL(KILN_ESHAPE, "operands must have rank >= 1: %s x %s", TS(a, x), TS(b, y));
	int64_t k1 = a->dim[a->rank - 1], k2 = b->dim[b->rank > 1 ? b->rank - 2 : 0];
	if (k1 != k2)
		FAIL(KILN_ESHAPE, "inner dims differ: %s x %s", TS(a, x), TS(b, y));
	/* batch dims: all but the last two (or one, for 1-D) */
	ir_type ba = {a->dtype, a->rank > 2 ? a->rank - 2 : 0, {0}};
	ir_type bb = {a->dtype, b->rank > 2 ? b->rank - 2 : 0, {0}};
	memcpy(ba.dim, a->dim, ba.rank * sizeof a->dim[0]);
	memcpy(bb.dim, b->dim, bb.rank * sizeof b->dim[0]);
	ir_type t;
	if (ba.rank || bb.rank)
		TRY(ir_broadcast(g, n, &ba, &bb, &t));
	else
		t = ba;
	if (a->rank > 1)
		t.dim[t.rank++] = a->dim[a->rank - 2];
	if (b->rank > 1)
		t.dim[t.rank++] = b->dim[b->rank - 1];
	out[0] = t;
	return KILN_OK;
}

kiln_status ir_shape_gemm(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *a = &in[0], *b = &in[1];
	tbuf x, y;
	for (uint32_t i = 1; i < n->nin; i++)
		TRY(need_dtype(g, n, in, i, a->dtype, i == 1 ? "B" : "C"));
	if (a->rank != 2 || b->rank != 2)
		FAIL(KILN_ESHAPE, "A and B must be 2-D: %s x %s", TS(a, x), TS(b, y));
	bool ta = ir_attr_int(n, "transA", 0), tb = ir_attr_int(n, "transB", 0);
	int64_t m = a->dim[ta], ka = a->dim[!ta], kb = b->dim[tb], nn = b->dim[!tb];
	if (ka != kb)
		FAIL(KILN_ESHAPE, "inner dims differ: %s%s x %s%s", TS(a, x), ta ? "'" : "",
		     TS(b, y), tb ? "'" : "");
	ir_type t = {a->dtype, 2, {m, nn}};
	if (n->nin == 3) { /* C broadcasts to [M,N], never the other way */
		ir_type c;
		TRY(ir_broadcast(g, n, &t, &in[2], &c));
		if (!ir_type_eq(&c, &t)) {
			tbuf z;
			FAIL(KILN_ESHAPE, "C %s does not broadcast to the result %s", TS(&in[2], x),
			     TS(&t, z));
		}
	}
	out[0] = t;
	return KILN_OK;
}

/* ---- convolution and pooling --------------------------------------------- */

/* Spatial geometry shared by Conv, ConvTranspose and the pools. */
typedef struct geom {
	int nsp;
	int64_t k[3], s[3], d[3], pb[3], pe[3];
	const char *autopad;
	bool ceil;
} geom;

/* Reads an ints attribute of length want into v (default dflt each). */
static kiln_status geom_ints(kiln_graph *g, const ir_node *n, const char *name, int want,
                             int64_t dflt, int64_t min, int64_t *v)
{
	const int64_t max = INT32_MAX; /* keeps the size arithmetic in range */
	const int64_t *a;
	uint32_t cnt = ir_attr_ints(n, name, &a);
	if (cnt && cnt != (uint32_t)want)
		FAIL(KILN_EINVAL, "%s has %u values, expected %d", name, cnt, want);
	for (int i = 0; i < want; i++) {
		v[i] = cnt ? a[i] : dflt;
		if (v[i] < min || v[i] > max)
			FAIL(KILN_EINVAL, "%s[%d] is %lld, must be in [%lld, %lld]", name, i,
			     (long long)v[i], (long long)min, (long long)max);
	}
	return KILN_OK;
}

/* kernel: the kernel's spatial dims (from the weight), or NULL to take them
 * from the kernel_shape attribute, which must then be present. */
static kiln_status geom_read(kiln_graph *g, const ir_node *n, const ir_type *x,
                             const int64_t *kernel, geom *o)
{
	memset(o, 0, sizeof *o);
	TRY(need_rank(g, n, x, 3, 5, "input"));
	o->nsp = x->rank - 2;
	int64_t ks[3], pads[6];
	const int64_t *kv;
	bool has_k = ir_attr_ints(n, "kernel_shape", &kv) != 0;
	if (!kernel && !has_k)
		FAIL(KILN_EINVAL, "kernel_shape is required");
	TRY(geom_ints(g, n, "kernel_shape", o->nsp, 1, 1, ks));
	for (int i = 0; i < o->nsp; i++) {
		if (kernel && has_k && kernel[i] != ks[i]) {
			char b[96];
			FAIL(KILN_ESHAPE, "kernel_shape %s disagrees with the weight's spatial dims",
			     ir_ints_str(kv, o->nsp, b, sizeof b));
		}
		if (kernel && kernel[i] < 0)
			FAIL(KILN_EUNSUPPORTED, "weight has a symbolic kernel size");
		o->k[i] = kernel ? kernel[i] : ks[i];
	}
	TRY(geom_ints(g, n, "strides", o->nsp, 1, 1, o->s));
	TRY(geom_ints(g, n, "dilations", o->nsp, 1, 1, o->d));
	TRY(geom_ints(g, n, "pads", 2 * o->nsp, 0, 0, pads));
	memcpy(o->pb, pads, o->nsp * sizeof pads[0]);
	memcpy(o->pe, pads + o->nsp, o->nsp * sizeof pads[0]);
	o->autopad = ir_attr_str(n, "auto_pad", "NOTSET");
	o->ceil = ir_attr_int(n, "ceil_mode", 0) != 0;
	static const char *const modes[] = {"NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"};
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
		if (!strcmp(o->autopad, modes[i]))
			return KILN_OK;
	FAIL(KILN_EINVAL, "unknown auto_pad \"%s\"", o->autopad);
}

/* Output size of spatial axis i for a forward window op:
 * floor((in + pads - ek) / s) + 1, or ceil(...) in ceil_mode, where a last
 * window starting in the end padding is dropped (as PyTorch and ORT do). */
static kiln_status window_out(kiln_graph *g, const ir_node *n, const ir_type *x, const geom *o,
                              int i, int64_t *out)
{
	int64_t in = x->dim[2 + i], s = o->s[i], ek = (o->k[i] - 1) * o->d[i] + 1;
	tbuf b;
	if (!strncmp(o->autopad, "SAME", 4)) { /* ceil(in / s) */
		*out = ir_dim_div(g, ir_dim_add(g, in, s - 1), s);
		return KILN_OK;
	}
	int64_t pads = strcmp(o->autopad, "VALID") ? o->pb[i] + o->pe[i] : 0;
	int64_t c = pads - ek + (o->ceil ? s - 1 : 0);
	if (in >= 0) {
		if (in + pads < ek)
			FAIL(KILN_ESHAPE, "window %lld (dilated) exceeds padded size %lld on spatial "
			     "axis %d of %s", (long long)ek, (long long)(in + pads), i, TS(x, b));
		int64_t r = (in + c) / s + 1;
		if (o->ceil && (r - 1) * s >= in + o->pb[i])
			r--;
		*out = r;
		return KILN_OK;
	}
	/* symbolic: floor((in + c) / s) + 1 == floor((in + c + s) / s) */
	if (o->ceil || c + s < 0) {
		char d[96];
		FAIL(KILN_EUNSUPPORTED, "output size of symbolic spatial dim %s of %s needs %s",
		     ir_dim_str(g, in, d, sizeof d), TS(x, b),
		     o->ceil ? "ceil_mode on a concrete size" : "subtraction from it");
	}
	*out = ir_dim_div(g, ir_dim_add(g, in, c + s), s);
	return KILN_OK;
}

/* Conv's bias (NULL: none) must be [C_out] and share x's dtype. */
static kiln_status conv_bias(kiln_graph *g, const ir_node *n, const ir_type *x, const ir_type *w,
                             const ir_type *bias, int64_t cout)
{
	if (!bias)
		return KILN_OK;
	tbuf a, b;
	if (bias->dtype != x->dtype)
		FAIL(KILN_ESHAPE, "bias must have dtype %s like %s, got %s", kiln_dtype_name(x->dtype),
		     TS(x, a), TS(bias, b));
	if (bias->rank != 1 || bias->dim[0] != cout) {
		char d[64];
		FAIL(KILN_ESHAPE, "bias %s must be [%s] for weight %s", TS(bias, a),
		     ir_dim_str(g, cout, d, sizeof d), TS(w, b));
	}
	return KILN_OK;
}

/* x [N,C,sp...], w [M, C/group, k...] -> [N, M, out...] */
kiln_status ir_shape_conv(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	return ir_shape_conv_of(g, n, in, n->nin > 2 ? &in[2] : NULL, out);
}

kiln_status ir_shape_conv_of(kiln_graph *g, const ir_node *n, const ir_type *in,
                             const ir_type *bias, ir_type *out)
{
	const ir_type *x = &in[0], *w = &in[1];
	tbuf a, b;
	TRY(need_dtype(g, n, in, 1, x->dtype, "weight"));
	if (w->rank != x->rank)
		FAIL(KILN_ESHAPE, "weight %s must have the rank of x %s", TS(w, b), TS(x, a));
	geom o;
	TRY(geom_read(g, n, x, w->dim + 2, &o));
	int64_t group = ir_attr_int(n, "group", 1);
	if (group < 1 || group > INT32_MAX)
		FAIL(KILN_EINVAL, "group must be in [1, 2^31), got %lld", (long long)group);
	int64_t want;
	TRY(ir_dim_mul_checked(g, n, w->dim[1], group, &want));
	if (x->dim[1] != want) {
		char c1[64], c2[64];
		FAIL(KILN_ESHAPE, "channels differ: x %s has %s, weight %s expects %s", TS(x, a),
		     ir_dim_str(g, x->dim[1], c1, sizeof c1), TS(w, b),
		     ir_dim_str(g, want, c2, sizeof c2));
	}
	if (w->dim[0] >= 0 && w->dim[0] % group)
		FAIL(KILN_ESHAPE, "output channels of weight %s not divisible by group %lld",
		     TS(w, b), (long long)group);
	TRY(conv_bias(g, n, x, w, bias, w->dim[0]));
	ir_type t = {x->dtype, x->rank, {x->dim[0], w->dim[0]}};
	for (int i = 0; i < o.nsp; i++)
		TRY(window_out(g, n, x, &o, i, &t.dim[2 + i]));
	out[0] = t;
	return KILN_OK;
}

/* out = s*(in-1) + output_padding + ek - pb - pe, or output_shape, or
 * in*s for SAME padding. */
static kiln_status tconv_out(kiln_graph *g, const ir_node *n, const ir_type *x, const geom *o,
                             const int64_t *opad, int i, int64_t *out)
{
	int64_t in = x->dim[2 + i], s = o->s[i], ek = (o->k[i] - 1) * o->d[i] + 1;
	if (!strncmp(o->autopad, "SAME", 4)) {
		*out = ir_dim_mul(g, in, s);
		return KILN_OK;
	}
	int64_t pads = strcmp(o->autopad, "VALID") ? o->pb[i] + o->pe[i] : 0;
	int64_t c = opad[i] + ek - pads - s; /* out = in*s + c */
	tbuf b;
	if (in >= 0) {
		if (in > IR_DIM_MAX / s)
			FAIL(KILN_EUNSUPPORTED, "output of %s is too large", TS(x, b));
		if (in * s + c <= 0)
			FAIL(KILN_ESHAPE, "pads leave no output on spatial axis %d of %s", i,
			     TS(x, b));
		*out = in * s + c;
		return KILN_OK;
	}
	if (c < 0) {
		char d[96];
		FAIL(KILN_EUNSUPPORTED, "output size of symbolic spatial dim %s of %s needs "
		     "subtraction from it", ir_dim_str(g, in, d, sizeof d), TS(x, b));
	}
	*out = ir_dim_add(g, ir_dim_mul(g, in, s), c);
	return KILN_OK;
}

/* x [N,C,sp...], w [C, M/group, k...] -> [N, M, out...] */
kiln_status ir_shape_conv_transpose(kiln_graph *g, const ir_node *n, const ir_type *in,
                                    ir_type *out)
{
	const ir_type *x = &in[0], *w = &in[1];
	tbuf a, b;
	TRY(need_dtype(g, n, in, 1, x->dtype, "weight"));
	if (w->rank != x->rank)
		FAIL(KILN_ESHAPE, "weight %s must have the rank of x %s", TS(w, b), TS(x, a));
	geom o;
	TRY(geom_read(g, n, x, w->dim + 2, &o));
	int64_t group = ir_attr_int(n, "group", 1), opad[3];
	if (group < 1 || group > INT32_MAX)
		FAIL(KILN_EINVAL, "group must be in [1, 2^31), got %lld", (long long)group);
	if (x->dim[1] != w->dim[0]) {
		char c1[64], c2[64];
		FAIL(KILN_ESHAPE, "channels differ: x %s has %s, weight %s expects %s", TS(x, a),
		     ir_dim_str(g, x->dim[1], c1, sizeof c1), TS(w, b),
		     ir_dim_str(g, w->dim[0], c2, sizeof c2));
	}
	int64_t cout;
	TRY(ir_dim_mul_checked(g, n, w->dim[1], group, &cout));
	TRY(conv_bias(g, n, x, w, n->nin > 2 ? &in[2] : NULL, cout));
	TRY(geom_ints(g, n, "output_padding", o.nsp, 0, 0, opad));
	ir_type t = {x->dtype, x->rank, {x->dim[0], cout}};
	const int64_t *os;
	uint32_t nos = ir_attr_ints(n, "output_shape", &os);
	if (nos && nos != (uint32_t)o.nsp && nos != (uint32_t)x->rank)
		FAIL(KILN_EINVAL, "output_shape has %u values, expected %d", nos, o.nsp);
	for (int i = 0; i < o.nsp; i++) {
		if (nos)
			t.dim[2 + i] = os[nos - o.nsp + i];
		else
			TRY(tconv_out(g, n, x, &o, opad, i, &t.dim[2 + i]));
	}
	out[0] = t;
	return KILN_OK;
}

kiln_status ir_shape_pool(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	geom o;
	TRY(geom_read(g, n, &in[0], NULL, &o));
	ir_type t = in[0];
	for (int i = 0; i < o.nsp; i++)
		TRY(window_out(g, n, &in[0], &o, i, &t.dim[2 + i]));
	out[0] = t;
	if (n->nout == 2) { /* MaxPool's Indices: where each max came from in x */
		int64_t so = ir_attr_int(n, "storage_order", 0);
		if (so != 0 && so != 1)
			FAIL(KILN_EINVAL, "storage_order is %lld; it is 0 (row major) or 1 (column major)",
			     (long long)so);
		out[1] = t;
		out[1].dtype = KILN_I64;
	}
	return KILN_OK;
}

kiln_status ir_shape_global_pool(kiln_graph *g, const ir_node *n, const ir_type *in,
                                 ir_type *out)
{
	TRY(need_rank(g, n, &in[0], 3, KILN_MAX_RANK, "input"));
	out[0] = in[0];
	for (int i = 2; i < in[0].rank; i++)
		out[0].dim[i] = 1;
	return KILN_OK;
}

/* ---- normalisation ------------------------------------------------------- */

/* X [N,C,...]; scale, B, mean, var [C]; training mode may also return the
 * updated running mean and variance. */
kiln_status ir_shape_batch_norm(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out)
{
	static const char *const what[] = {"X", "scale", "B", "input_mean", "input_var"};
	TRY(need_rank(g, n, &in[0], 2, KILN_MAX_RANK, "X"));
	for (int i = 1; i < 5; i++) {
		tbuf a, b;
		if (!kiln_dtype_is_float(in[i].dtype) || in[i].rank != 1 ||
		    in[i].dim[0] != in[0].dim[1])
			FAIL(KILN_ESHAPE, "%s %s must be a float vector of the channels of X %s",
			     what[i], TS(&in[i], a), TS(&in[0], b));
	}
	bool training = ir_attr_int(n, "training_mode", 0) != 0;
	if (!training && n->nout != 1)
		FAIL(KILN_EINVAL, "has %u outputs; only training_mode=1 returns running stats",
		     n->nout);
	out[0] = in[0];
	for (uint32_t i = 1; i < n->nout; i++)
		out[i] = in[2 + i]; /* running_mean like input_mean, running_var like var */
	return KILN_OK;
}

/* ONNX TensorProto element types allowed for stash_type. */
static kiln_dtype stash_dtype(int64_t t)
{
	switch (t) {
	case 1: return KILN_F32;
	case 10: return KILN_F16;
	case 11: return KILN_F64;
	case 16: return KILN_BF16;
	default: return KILN_DT_INVALID;
	}
}

kiln_status ir_shape_layer_norm(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out)
{
	const ir_type *x = &in[0];
	int axis;
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", -1), x->rank, 0, x, &axis));
	/* scale and bias broadcast to the normalised shape x[axis:] */
	ir_type norm = {x->dtype, x->rank - axis, {0}}, t;
	memcpy(norm.dim, x->dim + axis, norm.rank * sizeof x->dim[0]);
	for (uint32_t i = 1; i < n->nin; i++) {
		TRY(need_dtype(g, n, in, i, x->dtype, i == 1 ? "scale" : "bias"));
		TRY(ir_broadcast(g, n, &norm, &in[i], &t));
		if (!ir_type_eq(&t, &norm)) {
			tbuf a, b;
			FAIL(KILN_ESHAPE, "%s %s does not broadcast to the normalised dims of %s",
			     i == 1 ? "scale" : "bias", TS(&in[i], a), TS(x, b));
		}
	}
	kiln_dtype st = stash_dtype(ir_attr_int(n, "stash_type", 1));
	if (!st)
		FAIL(KILN_EINVAL, "unsupported stash_type %lld",
		     (long long)ir_attr_int(n, "stash_type", 1));
	out[0] = *x;
	for (uint32_t i = 1; i < n->nout; i++) { /* Mean, InvStdDev: x[:axis] + 1s */
		out[i] = *x;
		out[i].dtype = st;
		for (int d = axis; d < x->rank; d++)
			out[i].dim[d] = 1;
	}
	return KILN_OK;
}

kiln_status ir_shape_softmax(kiln_graph *g, const ir_node *n, const ir_type *in,
                             ir_type *out)
{
	int axis;
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", -1), in[0].rank, 0, &in[0], &axis));
	out[0] = in[0];
	return KILN_OK;
}

kiln_status ir_shape_dropout(kiln_graph *g, const ir_node *n, const ir_type *in,
                             ir_type *out)
{
	double r = ir_attr_float(n, "ratio", 0.5);
	if (!(r >= 0 && r < 1))
		FAIL(KILN_EINVAL, "ratio must be in [0, 1), got %g", r);
	out[0] = in[0];
	if (n->nout > 1) {
		out[1] = in[0];
		out[1].dtype = KILN_BOOL;
	}
	return KILN_OK;
}

/* ---- losses ---------------------------------------------------------- */

/* scores [N,C,d...], integer target [N,d...], optional weight [C]; output 0
 * is [N,d...] for reduction "none", a scalar otherwise. */
kiln_status ir_shape_loss(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *x = &in[0], *y = &in[1];
	tbuf a, b;
	TRY(need_rank(g, n, x, 2, KILN_MAX_RANK, "scores"));
	if (y->dtype != KILN_I32 && y->dtype != KILN_I64)
		FAIL(KILN_ESHAPE, "target must be i32 or i64, got %s", TS(y, a));
	bool fit = y->rank == x->rank - 1 && y->dim[0] == x->dim[0];
	for (int i = 1; fit && i < y->rank; i++)
		fit = y->dim[i] == x->dim[i + 1];
	if (!fit)
		FAIL(KILN_ESHAPE, "target %s does not fit scores %s (want [N,d...] of [N,C,d...])",
		     TS(y, a), TS(x, b));
	if (n->nin == 3) {
		TRY(need_dtype(g, n, in, 2, x->dtype, "weight"));
		if (in[2].rank != 1 || in[2].dim[0] != x->dim[1])
			FAIL(KILN_ESHAPE, "weight %s must be [C] for scores %s", TS(&in[2], a),
			     TS(x, b));
	}
	const char *red = ir_attr_str(n, "reduction", "mean");
	if (!strcmp(red, "none")) {
		out[0] = *y;
		out[0].dtype = x->dtype;
	} else if (!strcmp(red, "mean") || !strcmp(red, "sum"))
		out[0] = (ir_type){x->dtype, 0, {0}};
	else
		FAIL(KILN_EINVAL, "reduction must be none, mean or sum, got \"%s\"", red);
	if (n->nout > 1) /* log_prob */
		out[1] = *x;
	return KILN_OK;
}

void ir_conv_pad(const char *auto_pad, bool derive, bool transpose, int64_t in, int64_t out,
                 int64_t span, int64_t stride, int64_t opad, int64_t attr_begin,
                 int64_t attr_end, int64_t *begin, int64_t *end)
{
	if (derive) {
		int64_t total = transpose ? stride * (in - 1) + opad + span - out
		                          : (out - 1) * stride + span - in;
		total = total < 0 ? 0 : total;
		*begin = !strcmp(auto_pad, "SAME_UPPER") ? total / 2 : total - total / 2;
		*end = total - *begin;
	} else if (!strcmp(auto_pad, "VALID")) {
		*begin = *end = 0;
	} else {
		*begin = attr_begin;
		*end = attr_end;
	}
}
