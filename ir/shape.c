/*
 * shape.c: dtype and shape inference, one small rule per op or op family,
 * following ONNX opset 17 with kiln's attributes-for-constant-inputs
 * convention (see ops.def).
 *
 * The key idea is that a dimension is just an int64_t: fixed sizes are
 * >= 0 and symbolic sizes are handles to hash-consed expressions, so the
 * rules compare dims with == and build new ones with ir_dim_add/mul/div
 * (N+1 stays symbolic, and equal expressions are equal ints).  The
 * expression language has no subtraction, so where a rule would need N-2
 * or a concrete value of N (a slice inside a symbolic axis, splitting one)
 * it says so with KILN_EUNSUPPORTED rather than guessing.
 *
 * ir_infer_types does the checks every op shares (arity from ops.def,
 * live, well-typed inputs, the flag-driven dtype rule on input 0) and then
 * calls ir_shape_table[op].  Rules never intern strings or allocate in the
 * arena: they only read values and append dimension expressions, which is
 * what lets the verifier run them on a private copy of the expression
 * table (see verify.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* A type as text, for messages; each call needs its own buffer. */
typedef char tbuf[192];
#define TS(t, b) ir_type_str(g, (t), (b), sizeof(b))
#define FAIL(code, ...) return ir_errorf(g, n, code, __VA_ARGS__)
#define TRY(x)                                                                    \
	do {                                                                      \
		kiln_status st_ = (x);                                            \
		if (st_ != KILN_OK)                                               \
			return st_;                                               \
	} while (0)

static bool is_int(kiln_dtype dt)
{
	return dt == KILN_I8 || dt == KILN_U8 || dt == KILN_I32 || dt == KILN_I64;
}

static const char *ints_str(const int64_t *v, uint32_t cnt, char *buf, size_t size)
{
	size_t k = snprintf(buf, size, "[");
	for (uint32_t i = 0; i < cnt && k < size; i++)
		k += snprintf(buf + k, size - k, "%s%lld", i ? "," : "", (long long)v[i]);
	if (k < size)
		snprintf(buf + k, size - k, "]");
	return buf;
}

/* Normalises axis against rank (ONNX: [-rank, rank-1], or [-rank, rank]
 * when extra is 1, as for Flatten and Unsqueeze). */
static kiln_status axis_norm(kiln_graph *g, const ir_node *n, int64_t axis, int rank,
                             int extra, const ir_type *t, int *out)
{
	int64_t r = rank + extra;
	if (axis < -r || axis >= r) {
		tbuf b;
		FAIL(KILN_ESHAPE, "axis %lld out of range for %s", (long long)axis, TS(t, b));
	}
	*out = (int)(axis < 0 ? axis + r : axis);
	return KILN_OK;
}

/* Normalises an axes list into a mask, rejecting duplicates. */
static kiln_status axes_mask(kiln_graph *g, const ir_node *n, const int64_t *ax, uint32_t cnt,
                             int rank, const ir_type *t, bool *mask)
{
	memset(mask, 0, KILN_MAX_RANK + 1);
	for (uint32_t i = 0; i < cnt; i++) {
		int a;
		TRY(axis_norm(g, n, ax[i], rank, 0, t, &a));
		if (mask[a]) {
			tbuf b;
			FAIL(KILN_ESHAPE, "axis %lld repeated for %s", (long long)ax[i], TS(t, b));
		}
		mask[a] = true;
	}
	return KILN_OK;
}

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

/* A product of dims as a constant times a multiset of symbolic factors,
 * so that products can be compared and divided. */
typedef struct prod {
	int64_t c;
	int nf;
	int64_t f[32];
	bool overflow;
} prod;

static void prod_add(const kiln_graph *g, prod *p, int64_t d)
{
	const ir_dimexpr *e = ir_dim_expr(g, d);
	if (!e) {
		if (__builtin_mul_overflow(p->c, d, &p->c))
			p->overflow = true;
	} else if (e->op == IR_DMUL) {
		prod_add(g, p, e->a);
		prod_add(g, p, e->b);
	} else if (p->nf < 32)
		p->f[p->nf++] = d;
	else
		p->overflow = true;
}

/* Dims above this are refused at the door, so that sums of a few of them
 * and products with window sizes cannot overflow. */
#define IR_DIM_MAX ((int64_t)1 << 48)

/* ir_dim_mul with an overflow check on the concrete part. */
static kiln_status dim_mul(kiln_graph *g, const ir_node *n, int64_t a, int64_t b, int64_t *out)
{
	prod p = {1, 0, {0}, false};
	prod_add(g, &p, a);
	prod_add(g, &p, b);
	if (p.overflow || p.c > IR_DIM_MAX)
		FAIL(KILN_EUNSUPPORTED, "dimension product is too large");
	*out = ir_dim_mul(g, a, b);
	return KILN_OK;
}

/* ---- broadcasting -------------------------------------------------------- */

kiln_status ir_broadcast(kiln_graph *g, const ir_node *n, const ir_type *a, const ir_type *b,
                         ir_type *out)
{
	ir_type t = {a->dtype, a->rank > b->rank ? a->rank : b->rank, {0}};
	for (int i = 0; i < t.rank; i++) {
		int ia = i - (t.rank - a->rank), ib = i - (t.rank - b->rank);
		int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
		if (da == db || db == 1)
			t.dim[i] = da;
		else if (da == 1)
			t.dim[i] = db;
		else {
			tbuf x, y;
			FAIL(KILN_ESHAPE, "cannot broadcast %s with %s", TS(a, x), TS(b, y));
		}
	}
	*out = t;
	return KILN_OK;
}

/* ---- elementwise --------------------------------------------------------- */

static kiln_status shape_same(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	out[0] = in[0];
	return KILN_OK;
}

static kiln_status shape_gelu(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const char *ap = ir_attr_str(n, "approximate", "none");
	if (strcmp(ap, "none") && strcmp(ap, "tanh"))
		FAIL(KILN_EINVAL, "approximate must be \"none\" or \"tanh\", got \"%s\"", ap);
	return shape_same(g, n, in, out);
}

static kiln_status shape_cast(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	int64_t to = ir_attr_int(n, "to", KILN_DT_INVALID);
	if (to <= KILN_DT_INVALID || to >= KILN_DT_COUNT)
		FAIL(KILN_EINVAL, "'to' must be a valid dtype, got %lld", (long long)to);
	out[0] = in[0];
	out[0].dtype = (kiln_dtype)to;
	return KILN_OK;
}

/* Binary and variadic broadcasting ops: equal dtypes, NumPy shapes; a
 * comparison yields bool. */
static kiln_status shape_bcast(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	ir_type t = in[0];
	for (uint32_t i = 1; i < n->nin; i++) {
		if (in[i].dtype != in[0].dtype) {
			tbuf a, b;
			FAIL(KILN_ESHAPE, "dtypes differ: %s vs %s", TS(&in[0], a), TS(&in[i], b));
		}
		TRY(ir_broadcast(g, n, &t, &in[i], &t));
	}
	if (ir_op(n->op)->flags & IR_CMP)
		t.dtype = KILN_BOOL;
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_where(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	tbuf a, b;
	if (in[0].dtype != KILN_BOOL)
		FAIL(KILN_ESHAPE, "condition must be bool, got %s", TS(&in[0], a));
	if (in[1].dtype != in[2].dtype)
		FAIL(KILN_ESHAPE, "dtypes differ: %s vs %s", TS(&in[1], a), TS(&in[2], b));
	ir_type t;
	TRY(ir_broadcast(g, n, &in[1], &in[2], &t));
	TRY(ir_broadcast(g, n, &in[0], &t, &t));
	t.dtype = in[1].dtype;
	out[0] = t;
	return KILN_OK;
}

/* ---- reductions ---------------------------------------------------------- */

static kiln_status shape_reduce(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const int64_t *ax;
	uint32_t cnt = ir_attr_ints(n, "axes", &ax);
	bool keep = ir_attr_int(n, "keepdims", 1) != 0, mask[KILN_MAX_RANK + 1];
	if (cnt == 0 && ir_attr_int(n, "noop_with_empty_axes", 0)) {
		out[0] = in[0];
		return KILN_OK;
	}
	TRY(axes_mask(g, n, ax, cnt, in[0].rank, &in[0], mask));
	ir_type t = {in[0].dtype, 0, {0}};
	for (int i = 0; i < in[0].rank; i++) {
		bool red = cnt == 0 || mask[i];
		if (!red)
			t.dim[t.rank++] = in[0].dim[i];
		else if (keep)
			t.dim[t.rank++] = 1;
	}
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_argmax(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	int axis;
	TRY(axis_norm(g, n, ir_attr_int(n, "axis", 0), in[0].rank, 0, &in[0], &axis));
	ir_type t = in[0];
	t.dtype = KILN_I64;
	if (ir_attr_int(n, "keepdims", 1))
		t.dim[axis] = 1;
	else {
		memmove(&t.dim[axis], &t.dim[axis + 1], (t.rank - axis - 1) * sizeof t.dim[0]);
		t.rank--;
	}
	out[0] = t;
	return KILN_OK;
}

/* ---- linear algebra ------------------------------------------------------ */

/* NumPy matmul: 1-D operands get a unit dim that is dropped again, the
 * leading (batch) dims broadcast. */
static kiln_status shape_matmul(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
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

static kiln_status shape_gemm(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
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
			     ints_str(kv, o->nsp, b, sizeof b));
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

/* Conv's bias must be [C_out] and share x's dtype. */
static kiln_status conv_bias(kiln_graph *g, const ir_node *n, const ir_type *in, int64_t cout)
{
	if (n->nin < 3)
		return KILN_OK;
	TRY(need_dtype(g, n, in, 2, in[0].dtype, "bias"));
	if (in[2].rank != 1 || in[2].dim[0] != cout) {
		tbuf a, b;
		char d[64];
		FAIL(KILN_ESHAPE, "bias %s must be [%s] for weight %s", TS(&in[2], a),
		     ir_dim_str(g, cout, d, sizeof d), TS(&in[1], b));
	}
	return KILN_OK;
}

/* x [N,C,sp...], w [M, C/group, k...] -> [N, M, out...] */
static kiln_status shape_conv(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
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
	TRY(dim_mul(g, n, w->dim[1], group, &want));
	if (x->dim[1] != want) {
		char c1[64], c2[64];
		FAIL(KILN_ESHAPE, "channels differ: x %s has %s, weight %s expects %s", TS(x, a),
		     ir_dim_str(g, x->dim[1], c1, sizeof c1), TS(w, b),
		     ir_dim_str(g, want, c2, sizeof c2));
	}
	if (w->dim[0] >= 0 && w->dim[0] % group)
		FAIL(KILN_ESHAPE, "output channels of weight %s not divisible by group %lld",
		     TS(w, b), (long long)group);
	TRY(conv_bias(g, n, in, w->dim[0]));
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
static kiln_status shape_conv_transpose(kiln_graph *g, const ir_node *n, const ir_type *in,
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
	TRY(dim_mul(g, n, w->dim[1], group, &cout));
	TRY(conv_bias(g, n, in, cout));
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

static kiln_status shape_pool(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	geom o;
	TRY(geom_read(g, n, &in[0], NULL, &o));
	ir_type t = in[0];
	for (int i = 0; i < o.nsp; i++)
		TRY(window_out(g, n, &in[0], &o, i, &t.dim[2 + i]));
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_global_pool(kiln_graph *g, const ir_node *n, const ir_type *in,
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
static kiln_status shape_batch_norm(kiln_graph *g, const ir_node *n, const ir_type *in,
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

static kiln_status shape_layer_norm(kiln_graph *g, const ir_node *n, const ir_type *in,
                                    ir_type *out)
{
	const ir_type *x = &in[0];
	int axis;
	TRY(axis_norm(g, n, ir_attr_int(n, "axis", -1), x->rank, 0, x, &axis));
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

static kiln_status shape_softmax(kiln_graph *g, const ir_node *n, const ir_type *in,
                                 ir_type *out)
{
	int axis;
	TRY(axis_norm(g, n, ir_attr_int(n, "axis", -1), in[0].rank, 0, &in[0], &axis));
	out[0] = in[0];
	return KILN_OK;
}

static kiln_status shape_dropout(kiln_graph *g, const ir_node *n, const ir_type *in,
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
static kiln_status shape_loss(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
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

/* ---- data movement -------------------------------------------------- */

/* Removes one occurrence of factor d from p; false if absent. */
static bool prod_take(prod *p, int64_t d)
{
	for (int i = 0; i < p->nf; i++)
		if (p->f[i] == d) {
			p->f[i] = p->f[--p->nf];
			return true;
		}
	return false;
}

static kiln_status reshape_dims(kiln_graph *g, const ir_node *n, const ir_type *x,
                                ir_type *t, int *infer)
{
	const int64_t *s;
	uint32_t ns = ir_attr_ints(n, "shape", &s);
	bool allowzero = ir_attr_int(n, "allowzero", 0) != 0;
	char b[128];
	if (!ir_attr_get(n, "shape") || ns > KILN_MAX_RANK)
		FAIL(KILN_EINVAL, "shape must be given with at most %d dims", KILN_MAX_RANK);
	*t = (ir_type){x->dtype, (int)ns, {0}};
	*infer = -1;
	for (uint32_t i = 0; i < ns; i++) {
		if (s[i] == 0 && !allowzero) {
			tbuf a;
			if (i >= (uint32_t)x->rank)
				FAIL(KILN_ESHAPE, "shape %s copies dim %u, which %s lacks",
				     ints_str(s, ns, b, sizeof b), i, TS(x, a));
			t->dim[i] = x->dim[i];
		} else if (s[i] == -1 && *infer < 0) {
			*infer = (int)i;
		} else if (s[i] < 0) {
			FAIL(KILN_ESHAPE, "bad target shape %s (one -1 at most, no other negatives)",
			     ints_str(s, ns, b, sizeof b));
		} else
			t->dim[i] = s[i];
	}
	return KILN_OK;
}

/* shape attr: 0 copies the input dim (unless allowzero), -1 is inferred
 * from the element count, which must be preserved. */
static kiln_status shape_reshape(kiln_graph *g, const ir_node *n, const ir_type *in,
                                 ir_type *out)
{
	ir_type t;
	int infer;
	TRY(reshape_dims(g, n, &in[0], &t, &infer));
	prod pi = {1, 0, {0}, false}, po = {1, 0, {0}, false};
	for (int i = 0; i < in[0].rank; i++)
		prod_add(g, &pi, in[0].dim[i]);
	for (int i = 0; i < t.rank; i++)
		if (i != infer)
			prod_add(g, &po, t.dim[i]);
	tbuf a;
	char b[128];
	const int64_t *s;
	uint32_t ns = ir_attr_ints(n, "shape", &s);
	if (pi.overflow || po.overflow)
		FAIL(KILN_ESHAPE, "element count of %s or %s overflows", TS(&in[0], a),
		     ints_str(s, ns, b, sizeof b));
	bool ok = true;
	for (int i = 0; i < po.nf && ok; i++)
		ok = prod_take(&pi, po.f[i]);
	if (infer >= 0 && ok && po.c != 0 && pi.c % po.c == 0) {
		int64_t d = pi.c / po.c;
		for (int i = 0; i < pi.nf; i++)
			d = ir_dim_mul(g, d, pi.f[i]);
		t.dim[infer] = d;
	} else if (infer >= 0 || !ok || pi.nf || pi.c != po.c) {
		if (!ok && infer >= 0)
			FAIL(KILN_EUNSUPPORTED, "cannot infer -1 in %s from %s: symbolic dims do "
			     "not cancel", ints_str(s, ns, b, sizeof b), TS(&in[0], a));
		FAIL(KILN_ESHAPE, "cannot reshape %s to %s: element count differs",
		     TS(&in[0], a), ints_str(s, ns, b, sizeof b));
	}
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_transpose(kiln_graph *g, const ir_node *n, const ir_type *in,
                                   ir_type *out)
{
	const int64_t *p;
	uint32_t np = ir_attr_ints(n, "perm", &p);
	int r = in[0].rank;
	bool seen[KILN_MAX_RANK] = {0}, ok = !np || np == (uint32_t)r;
	ir_type t = in[0];
	for (int i = 0; ok && i < r; i++) {
		int64_t src = np ? p[i] : r - 1 - i;
		ok = src >= 0 && src < r && !seen[src];
		if (ok) {
			seen[src] = true;
			t.dim[i] = in[0].dim[src];
		}
	}
	if (!ok) {
		tbuf a;
		char b[128];
		FAIL(KILN_ESHAPE, "perm %s is not a permutation of the axes of %s",
		     ints_str(p, np, b, sizeof b), TS(&in[0], a));
	}
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_concat(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out)
{
	int axis;
	if (!ir_attr_get(n, "axis"))
		FAIL(KILN_EINVAL, "axis is required");
	TRY(axis_norm(g, n, ir_attr_int(n, "axis", 0), in[0].rank, 0, &in[0], &axis));
	ir_type t = in[0];
	for (uint32_t i = 1; i < n->nin; i++) {
		bool fit = in[i].dtype == t.dtype && in[i].rank == t.rank;
		for (int d = 0; fit && d < t.rank; d++)
			fit = d == axis || in[i].dim[d] == t.dim[d];
		if (!fit) {
			tbuf a, b;
			FAIL(KILN_ESHAPE, "cannot concat %s and %s on axis %d", TS(&in[0], a),
			     TS(&in[i], b), axis);
		}
		if (t.dim[axis] + in[i].dim[axis] > IR_DIM_MAX) /* both <= IR_DIM_MAX */
			FAIL(KILN_EUNSUPPORTED, "concat result is too large");
		t.dim[axis] = ir_dim_add(g, t.dim[axis], in[i].dim[axis]);
	}
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_split(kiln_graph *g, const ir_node *n, const ir_type *in,
                               ir_type *out)
{
	const ir_type *x = &in[0];
	int axis;
	TRY(axis_norm(g, n, ir_attr_int(n, "axis", 0), x->rank, 0, x, &axis));
	const int64_t *sz;
	uint32_t cnt = ir_attr_ints(n, "split", &sz);
	int64_t d = x->dim[axis], sum = 0;
	tbuf a;
	char b[96];
	if (cnt && cnt != n->nout)
		FAIL(KILN_ESHAPE, "split has %u sizes for %u outputs", cnt, n->nout);
	if (d < 0 && (n->nout > 1 || cnt))
		FAIL(KILN_EUNSUPPORTED, "cannot split symbolic dim %s of %s",
		     ir_dim_str(g, d, b, sizeof b), TS(x, a));
	if (!cnt && d >= 0 && d % n->nout)
		FAIL(KILN_ESHAPE, "cannot split axis %d of %s into %u equal parts", axis, TS(x, a),
		     n->nout);
	for (uint32_t i = 0; i < n->nout; i++) {
		out[i] = *x;
		out[i].dim[axis] = n->nout == 1 ? d : cnt ? sz[i] : d / n->nout;
		if (cnt && (sz[i] < 0 || __builtin_add_overflow(sum, sz[i], &sum)))
			FAIL(KILN_ESHAPE, "bad split sizes %s", ints_str(sz, cnt, b, sizeof b));
	}
	if (cnt && sum != d)
		FAIL(KILN_ESHAPE, "split sizes %s do not add up to axis %d of %s",
		     ints_str(sz, cnt, b, sizeof b), axis, TS(x, a));
	return KILN_OK;
}

static int64_t clamp(int64_t v, int64_t lo, int64_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* Length of one sliced axis of concrete size d, with ONNX's clamping. */
static int64_t slice_len(int64_t d, int64_t start, int64_t end, int64_t step)
{
	if (start < 0)
		start += d;
	if (end < 0)
		end += d;
	if (step > 0) {
		start = clamp(start, 0, d);
		end = clamp(end, 0, d);
		return end > start ? (end - start - 1) / step + 1 : 0;
	}
	if (step == INT64_MIN) /* -step would overflow; any dim takes one element */
		step = -INT64_MAX;
	start = clamp(start, 0, d - 1);
	end = clamp(end, -1, d - 1);
	return start > end ? (start - end - 1) / -step + 1 : 0;
}

/* A slice that keeps a whole symbolic axis: [0:big:1] or [-1:-big:-1]. */
static bool slice_whole(int64_t start, int64_t end, int64_t step)
{
	const int64_t big = INT32_MAX;
	return (step == 1 && start == 0 && end >= big) ||
	       (step == -1 && (start == -1 || start >= big) && end <= -big);
}

static kiln_status shape_slice(kiln_graph *g, const ir_node *n, const ir_type *in,
                               ir_type *out)
{
	const ir_type *x = &in[0];
	const int64_t *st, *en, *ax, *sp;
	uint32_t ns = ir_attr_ints(n, "starts", &st), ne = ir_attr_ints(n, "ends", &en);
	uint32_t na = ir_attr_ints(n, "axes", &ax), nsp = ir_attr_ints(n, "steps", &sp);
	bool mask[KILN_MAX_RANK + 1];
	tbuf a;
	if (!ir_attr_get(n, "starts") || !ir_attr_get(n, "ends"))
		FAIL(KILN_EINVAL, "starts and ends are required");
	if (ns != ne || (na && na != ns) || (nsp && nsp != ns) || ns > (uint32_t)x->rank)
		FAIL(KILN_EINVAL, "starts, ends, axes and steps must have equal lengths <= rank "
		     "of %s (got %u, %u, %u, %u)", TS(x, a), ns, ne, na, nsp);
	int64_t dflt[KILN_MAX_RANK];
	for (uint32_t i = 0; i < ns; i++)
		dflt[i] = i;
	TRY(axes_mask(g, n, na ? ax : dflt, ns, x->rank, x, mask));
	ir_type t = *x;
	for (uint32_t i = 0; i < ns; i++) {
		int axis = (int)(na ? (ax[i] < 0 ? ax[i] + x->rank : ax[i]) : i);
		int64_t step = nsp ? sp[i] : 1, d = x->dim[axis];
		if (step == 0)
			FAIL(KILN_EINVAL, "slice step on axis %d is 0", axis);
		if (d >= 0)
			t.dim[axis] = slice_len(d, st[i], en[i], step);
		else if (!slice_whole(st[i], en[i], step)) {
			char b[96];
			FAIL(KILN_EUNSUPPORTED, "cannot slice symbolic dim %s of %s by [%lld:%lld:%lld]",
			     ir_dim_str(g, d, b, sizeof b), TS(x, a), (long long)st[i],
			     (long long)en[i], (long long)step);
		}
	}
	out[0] = t;
	return KILN_OK;
}

/* data[:axis] + indices.shape + data[axis+1:] */
static kiln_status shape_gather(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out)
{
	const ir_type *x = &in[0], *ix = &in[1];
	int axis;
	tbuf a, b;
	TRY(axis_norm(g, n, ir_attr_int(n, "axis", 0), x->rank, 0, x, &axis));
	if (ix->dtype != KILN_I32 && ix->dtype != KILN_I64)
		FAIL(KILN_ESHAPE, "indices must be i32 or i64, got %s", TS(ix, a));
	int r = x->rank - 1 + ix->rank;
	if (r > KILN_MAX_RANK)
		FAIL(KILN_EUNSUPPORTED, "result of gathering %s by %s exceeds rank %d", TS(x, a),
		     TS(ix, b), KILN_MAX_RANK);
	ir_type t = {x->dtype, 0, {0}};
	for (int i = 0; i < axis; i++)
		t.dim[t.rank++] = x->dim[i];
	for (int i = 0; i < ix->rank; i++)
		t.dim[t.rank++] = ix->dim[i];
	for (int i = axis + 1; i < x->rank; i++)
		t.dim[t.rank++] = x->dim[i];
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_flatten(kiln_graph *g, const ir_node *n, const ir_type *in,
                                 ir_type *out)
{
	/* axis is in [-rank, rank]; a negative one counts from rank, not rank+1 */
	int64_t ax = ir_attr_int(n, "axis", 1), r = in[0].rank;
	if (ax < -r || ax > r) {
		tbuf b;
		FAIL(KILN_ESHAPE, "axis %lld out of range for %s", (long long)ax, TS(&in[0], b));
	}
	int axis = (int)(ax < 0 ? ax + r : ax);
	int64_t lo = 1, hi = 1;
	for (int i = 0; i < in[0].rank; i++) {
		int64_t *p = i < axis ? &lo : &hi;
		TRY(dim_mul(g, n, *p, in[0].dim[i], p));
	}
	out[0] = (ir_type){in[0].dtype, 2, {lo, hi}};
	return KILN_OK;
}

static kiln_status shape_squeeze(kiln_graph *g, const ir_node *n, const ir_type *in,
                                 ir_type *out)
{
	const ir_type *x = &in[0];
	const int64_t *ax;
	uint32_t cnt = ir_attr_ints(n, "axes", &ax);
	bool mask[KILN_MAX_RANK + 1];
	TRY(axes_mask(g, n, ax, cnt, x->rank, x, mask));
	ir_type t = {x->dtype, 0, {0}};
	for (int i = 0; i < x->rank; i++) {
		if (cnt && mask[i] && x->dim[i] != 1) {
			tbuf a;
			char b[96];
			FAIL(x->dim[i] < 0 ? KILN_EUNSUPPORTED : KILN_ESHAPE,
			     "cannot squeeze axis %d of %s: size %s is not 1", i, TS(x, a),
			     ir_dim_str(g, x->dim[i], b, sizeof b));
		}
		if (!(cnt ? mask[i] : x->dim[i] == 1))
			t.dim[t.rank++] = x->dim[i];
	}
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_unsqueeze(kiln_graph *g, const ir_node *n, const ir_type *in,
                                   ir_type *out)
{
	const ir_type *x = &in[0];
	const int64_t *ax;
	uint32_t cnt = ir_attr_ints(n, "axes", &ax);
	tbuf a;
	if (cnt == 0 || x->rank + cnt > KILN_MAX_RANK)
		FAIL(KILN_ESHAPE, "cannot unsqueeze %s by %u axes (rank limit %d)", TS(x, a), cnt,
		     KILN_MAX_RANK);
	int r = x->rank + (int)cnt;
	bool mask[KILN_MAX_RANK + 1];
	ir_type big = {x->dtype, r, {0}}; /* for messages about the output rank */
	TRY(axes_mask(g, n, ax, cnt, r, &big, mask));
	ir_type t = {x->dtype, r, {0}};
	for (int i = 0, k = 0; i < r; i++)
		t.dim[i] = mask[i] ? 1 : x->dim[k++];
	out[0] = t;
	return KILN_OK;
}

/* Expand: bidirectional broadcast with the shape attribute; an entry < 0
 * is a symbolic dim of this graph. */
static kiln_status shape_expand(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out)
{
	const int64_t *s;
	uint32_t ns = ir_attr_ints(n, "shape", &s);
	char b[128];
	if (!ir_attr_get(n, "shape") || ns > KILN_MAX_RANK)
		FAIL(KILN_EINVAL, "shape must be given with at most %d dims", KILN_MAX_RANK);
	ir_type t = {in[0].dtype, (int)ns, {0}};
	for (uint32_t i = 0; i < ns; i++) {
		if (s[i] < 0 && !ir_dim_expr(g, s[i]))
			FAIL(KILN_ESHAPE, "bad expand shape %s", ints_str(s, ns, b, sizeof b));
		t.dim[i] = s[i];
	}
	return ir_broadcast(g, n, &in[0], &t, &out[0]);
}

static kiln_status shape_pad(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *x = &in[0];
	const int64_t *p;
	uint32_t np = ir_attr_ints(n, "pads", &p);
	const char *mode = ir_attr_str(n, "mode", "constant");
	tbuf a;
	char b[160];
	if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge"))
		FAIL(KILN_EINVAL, "mode must be constant, reflect or edge, got \"%s\"", mode);
	if (np != 2 * (uint32_t)x->rank)
		FAIL(KILN_ESHAPE, "pads %s must have 2 values per axis of %s",
		     ints_str(p, np, b, sizeof b), TS(x, a));
	ir_type t = *x;
	for (int i = 0; i < x->rank; i++) {
		int64_t d = x->dim[i], extra, sum;
		if (__builtin_add_overflow(p[i], p[i + x->rank], &extra) ||
		    (d >= 0 && __builtin_add_overflow(d, extra, &sum)) || extra > IR_DIM_MAX)
			FAIL(KILN_ESHAPE, "pads %s overflow axis %d of %s",
			     ints_str(p, np, b, sizeof b), i, TS(x, a));
		if (d >= 0 && d + extra < 0)
			FAIL(KILN_ESHAPE, "pads %s crop axis %d of %s below zero",
			     ints_str(p, np, b, sizeof b), i, TS(x, a));
		if (d < 0 && extra < 0)
			FAIL(KILN_EUNSUPPORTED, "pads %s crop symbolic axis %d of %s",
			     ints_str(p, np, b, sizeof b), i, TS(x, a));
		t.dim[i] = d >= 0 ? d + extra : ir_dim_add(g, d, extra);
	}
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_shape(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	int64_t r = in[0].rank, start = ir_attr_int(n, "start", 0);
	int64_t end = ir_attr_int(n, "end", r);
	start = clamp(start < 0 ? start + r : start, 0, r);
	end = clamp(end < 0 ? end + r : end, 0, r);
	out[0] = (ir_type){KILN_I64, 1, {end > start ? end - start : 0}};
	return KILN_OK;
}

static kiln_status shape_constant(kiln_graph *g, const ir_node *n, const ir_type *in,
                                  ir_type *out)
{
	const ir_attr *a = ir_attr_get(n, "value");
	if (!a || a->kind != IR_A_TENSOR || !a->u.t)
		FAIL(KILN_EINVAL, "value must be a tensor attribute");
	const kiln_tensor *t = a->u.t;
	if (t->rank < 0 || t->rank > KILN_MAX_RANK || t->dtype <= KILN_DT_INVALID ||
	    t->dtype >= KILN_DT_COUNT)
		FAIL(KILN_EINVAL, "value tensor has a bad dtype or rank");
	out[0] = (ir_type){t->dtype, t->rank, {0}};
	memcpy(out[0].dim, t->shape, t->rank * sizeof t->shape[0]);
	return KILN_OK;
}

/* ---- the table and the driver ---------------------------------------- */

const ir_shape_fn ir_shape_table[KILN_OP_COUNT] = {
	[KILN_OP_NEG] = shape_same, [KILN_OP_ABS] = shape_same, [KILN_OP_EXP] = shape_same,
	[KILN_OP_LOG] = shape_same, [KILN_OP_SQRT] = shape_same,
	[KILN_OP_RECIPROCAL] = shape_same, [KILN_OP_FLOOR] = shape_same,
	[KILN_OP_CEIL] = shape_same, [KILN_OP_SIN] = shape_same, [KILN_OP_COS] = shape_same,
	[KILN_OP_RELU] = shape_same, [KILN_OP_LEAKY_RELU] = shape_same,
	[KILN_OP_SIGMOID] = shape_same, [KILN_OP_TANH] = shape_same,
	[KILN_OP_GELU] = shape_gelu, [KILN_OP_ERF] = shape_same, [KILN_OP_CLIP] = shape_same,
	[KILN_OP_NOT] = shape_same, [KILN_OP_CAST] = shape_cast,
	[KILN_OP_IDENTITY] = shape_same,

	[KILN_OP_ADD] = shape_bcast, [KILN_OP_SUB] = shape_bcast, [KILN_OP_MUL] = shape_bcast,
	[KILN_OP_DIV] = shape_bcast, [KILN_OP_POW] = shape_bcast, [KILN_OP_MAX] = shape_bcast,
	[KILN_OP_MIN] = shape_bcast, [KILN_OP_EQUAL] = shape_bcast,
	[KILN_OP_LESS] = shape_bcast, [KILN_OP_GREATER] = shape_bcast,
	[KILN_OP_AND] = shape_bcast, [KILN_OP_OR] = shape_bcast, [KILN_OP_WHERE] = shape_where,

	[KILN_OP_REDUCE_SUM] = shape_reduce, [KILN_OP_REDUCE_MEAN] = shape_reduce,
	[KILN_OP_REDUCE_MAX] = shape_reduce, [KILN_OP_REDUCE_MIN] = shape_reduce,
	[KILN_OP_ARGMAX] = shape_argmax,

	[KILN_OP_MATMUL] = shape_matmul, [KILN_OP_GEMM] = shape_gemm,

	[KILN_OP_CONV] = shape_conv, [KILN_OP_CONV_TRANSPOSE] = shape_conv_transpose,
	[KILN_OP_MAX_POOL] = shape_pool, [KILN_OP_AVERAGE_POOL] = shape_pool,
	[KILN_OP_GLOBAL_AVERAGE_POOL] = shape_global_pool,

	[KILN_OP_BATCH_NORM] = shape_batch_norm, [KILN_OP_LAYER_NORM] = shape_layer_norm,
	[KILN_OP_SOFTMAX] = shape_softmax, [KILN_OP_LOG_SOFTMAX] = shape_softmax,

	[KILN_OP_RESHAPE] = shape_reshape, [KILN_OP_TRANSPOSE] = shape_transpose,
	[KILN_OP_CONCAT] = shape_concat, [KILN_OP_SPLIT] = shape_split,
	[KILN_OP_SLICE] = shape_slice, [KILN_OP_GATHER] = shape_gather,
	[KILN_OP_FLATTEN] = shape_flatten, [KILN_OP_SQUEEZE] = shape_squeeze,
	[KILN_OP_UNSQUEEZE] = shape_unsqueeze, [KILN_OP_EXPAND] = shape_expand,
	[KILN_OP_PAD] = shape_pad, [KILN_OP_SHAPE] = shape_shape,
	[KILN_OP_CONSTANT] = shape_constant,

	[KILN_OP_DROPOUT] = shape_dropout,
	[KILN_OP_SOFTMAX_CE] = shape_loss, [KILN_OP_NLL_LOSS] = shape_loss,
};

/* Ops whose first input is not governed by the flag rule below: Where's is
 * the bool condition, Cast and Shape take any dtype. */
static const bool any_first_dtype[KILN_OP_COUNT] = {
	[KILN_OP_WHERE] = true, [KILN_OP_CAST] = true, [KILN_OP_SHAPE] = true,
};

/* The dtype rule from the flags: floats always, integers with IR_INTOK,
 * bool for data movement and comparisons; IR_LOGIC wants bool only. */
static bool dtype_ok(uint32_t f, kiln_dtype dt)
{
	if (f & IR_LOGIC)
		return dt == KILN_BOOL;
	if (kiln_dtype_is_float(dt))
		return true;
	if (dt == KILN_BOOL)
		return (f & (IR_MOVE | IR_CMP)) != 0;
	return is_int(dt) && (f & IR_INTOK);
}

static kiln_status check_arity(kiln_graph *g, const ir_node *n)
{
	const ir_op_info *oi = ir_op(n->op);
	bool in_ok = n->nin >= oi->in_min && (oi->in_max == IR_VARIADIC || n->nin <= oi->in_max);
	bool out_ok = n->nout >= oi->out_min &&
	              (oi->out_max == IR_VARIADIC || n->nout <= oi->out_max);
	if (in_ok && out_ok)
		return KILN_OK;
	char lo[16], hi[16];
	const char *what = in_ok ? "outputs" : "inputs";
	int min = in_ok ? oi->out_min : oi->in_min, max = in_ok ? oi->out_max : oi->in_max;
	snprintf(lo, sizeof lo, "%d", min);
	snprintf(hi, sizeof hi, max == IR_VARIADIC ? "more" : "%d", max);
	if (min == max)
		FAIL(KILN_EINVAL, "takes %s %s, got %u", lo, what, in_ok ? n->nout : n->nin);
	FAIL(KILN_EINVAL, "takes %s to %s %s, got %u", lo, hi, what, in_ok ? n->nout : n->nin);
}

/* Fetches input i's type, checking that it is a live, well-typed value. */
static kiln_status input_type(kiln_graph *g, const ir_node *n, uint32_t i, ir_type *t)
{
	const ir_value *v = ir_val(g, n->in[i]);
	if (!v || n->in[i] == 0 || v->kind == IR_V_NONE)
		FAIL(KILN_EINVAL, "input %u (%%%u) is not a live value", i, n->in[i]);
	*t = v->type;
	if (t->dtype <= KILN_DT_INVALID || t->dtype >= KILN_DT_COUNT || t->rank < 0 ||
	    t->rank > KILN_MAX_RANK)
		FAIL(KILN_EINVAL, "input %u (%%%u) has no valid type", i, n->in[i]);
	for (int d = 0; d < t->rank; d++) {
		if (t->dim[d] < 0 && !ir_dim_expr(g, t->dim[d]))
			FAIL(KILN_EINVAL, "input %u (%%%u) has a bad symbolic dim", i, n->in[i]);
		if (t->dim[d] > IR_DIM_MAX)
			FAIL(KILN_EUNSUPPORTED, "input %u (%%%u) has dim %lld, above the limit 2^48",
			     i, n->in[i], (long long)t->dim[d]);
	}
	return KILN_OK;
}

static kiln_status infer(kiln_graph *g, const ir_node *n, ir_type *in, ir_type *out)
{
	for (uint32_t i = 0; i < n->nin; i++)
		TRY(input_type(g, n, i, &in[i]));
	uint32_t f = ir_op(n->op)->flags;
	if (n->nin && !any_first_dtype[n->op] && !dtype_ok(f, in[0].dtype)) {
		tbuf a;
		const char *want = f & IR_LOGIC ? "bool" : f & IR_INTOK ? "numeric" : "float";
		FAIL(KILN_ESHAPE, "needs a %s input, got %s", want, TS(&in[0], a));
	}
	memset(out, 0, n->nout * sizeof *out);
	if (!ir_shape_table[n->op])
		FAIL(KILN_EUNSUPPORTED, "no shape rule for this op");
	return ir_shape_table[n->op](g, n, in, out);
}

kiln_status ir_infer_types(kiln_graph *g, const ir_node *n, ir_type *out)
{
	if (!g || !n)
		return KILN_EINVAL;
	if (n->op >= KILN_OP_COUNT)
		return ir_errorf(g, NULL, KILN_EINVAL, "node #%u has unknown op %d", n->idx,
		                 (int)n->op);
	TRY(check_arity(g, n));
	/* Concat and Max/Min are variadic: only big nodes need the heap */
	ir_type small[16], *in = small;
	if (n->nin > 16 && !(in = malloc(n->nin * sizeof *in)))
		FAIL(KILN_ENOMEM, "out of memory inferring types");
	kiln_status st = infer(g, n, in, out);
	if (in != small)
		free(in);
	return st;
}

kiln_status ir_infer_node(kiln_graph *g, ir_node *n)
{
	if (!g || !n)
		return KILN_EINVAL;
	if (g->status != KILN_OK)
		return g->status;
	ir_type small[8], *out = small;
	if (n->nout > 8 && !(out = malloc(n->nout * sizeof *out)))
		FAIL(KILN_ENOMEM, "out of memory inferring types");
	kiln_status st = ir_infer_types(g, n, out);
	for (uint32_t i = 0; st == KILN_OK && i < n->nout; i++) {
		ir_value *v = ir_val(g, n->out[i]);
		if (v)
			v->type = out[i];
	}
	if (out != small)
		free(out);
	return st;
}
