/*
 * interp.c: the reference interpreter, the oracle every pass and backend is
 * checked against, so clarity beats speed throughout.
 *
 * kiln_graph_run binds each symbolic dim from the input tensors, evaluates
 * every value's concrete shape, then walks the schedule allocating each
 * node's outputs and calling one kernel per op from ir_interp_table.  Uses
 * are counted up front so an intermediate is freed right after its last
 * reader and memory stays bounded by the live set.
 *
 * Kernels compute in double through ir_load/ir_store, so a result rounds once
 * to the output dtype (f16 and bf16 round to nearest even).  Integer inputs
 * take int64 paths (ir_load_i64) so big values stay exact; integer Div
 * truncates like C and ONNX.  Element-wise kernels map every output index
 * back to each input with NumPy broadcast strides (stride 0 on a broadcast
 * dim).  Kernels trust the preallocated output shapes only as far as they
 * can check them: any index that would fall outside an input is an error,
 * never a read.  Dropout in training mode uses a counter-based generator
 * documented above dropout_u(), so other backends can match it bit for bit;
 * kiln_graph_run uses run seed 0.
 *
 * This file holds the driver, element access, the kernel helpers, the
 * element-wise, reduction, movement and linear-algebra kernels, and the
 * table; the neural-network kernels (conv, pools, normalisation, softmax,
 * dropout, losses) live in interp_nn.c, and ir/interp.h declares what the
 * two files share.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/interp.h"

/* ---- element access ----------------------------------------------------- */

static double half_to_double(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
	return h & 0x8000 ? -v : v;
}

static double bf16_to_double(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* Rounds v to a binary float with mant fraction bits and minimum normal
 * exponent emin, nearest-even; magnitudes reaching ovf become infinite.
 * Scaling by a power of two is exact, so nearbyint does the one rounding. */
static double round_to(double v, int mant, int emin, double ovf)
{
	if (!isfinite(v) || v == 0)
		return v;
	int e = ilogb(v);
	if (e < emin)
		e = emin;
	double r = scalbn(nearbyint(scalbn(v, mant - e)), e - mant);
	return fabs(r) >= ovf ? copysign(INFINITY, v) : r;
}

static uint16_t double_to_half(double v)
{
	uint16_t s = signbit(v) ? 0x8000 : 0;
	if (isnan(v))
		return s | 0x7e00;
	double r = fabs(round_to(v, 10, -14, 65536.0));
	if (isinf(r))
		return s | 0x7c00;
	if (r < 0x1p-14) /* subnormal or zero */
		return s | (uint16_t)(r * 0x1p24);
	int e = ilogb(r);
	return s | (uint16_t)((e + 15) << 10) | (uint16_t)(scalbn(r, 10 - e) - 1024);
}

static uint16_t double_to_bf16(double v)
{
	if (isnan(v))
		return signbit(v) ? 0xffc0 : 0x7fc0;
	float f = (float)round_to(v, 7, -126, 0x1p128); /* exact in binary32 */
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return (uint16_t)(u >> 16);
}

/* Float to integer truncates toward zero and saturates; NaN gives 0, so no
 * input can reach C's undefined out-of-range conversion. */
static int64_t sat_i64(double v, double lo, double hi)
{
	if (isnan(v))
		return 0;
	v = trunc(v);
	if (v <= lo)
		return (int64_t)lo;
	if (v >= hi)
		return hi >= 0x1p63 ? INT64_MAX : (int64_t)hi;
	return (int64_t)v;
}

double ir_load(const kiln_tensor *t, int64_t i)
{
	const void *p = t->data;
	switch (t->dtype) {
	case KILN_F32: return ((const float *)p)[i];
	case KILN_F64: return ((const double *)p)[i];
	case KILN_F16: return half_to_double(((const uint16_t *)p)[i]);
	case KILN_BF16: return bf16_to_double(((const uint16_t *)p)[i]);
	case KILN_I8: return ((const int8_t *)p)[i];
	case KILN_U8: return ((const uint8_t *)p)[i];
	case KILN_I32: return ((const int32_t *)p)[i];
	case KILN_I64: return (double)((const int64_t *)p)[i];
	case KILN_BOOL: return ((const uint8_t *)p)[i] != 0;
	default: return 0;
	}
}

void ir_store(kiln_tensor *t, int64_t i, double v)
{
	void *p = t->data;
	switch (t->dtype) {
	case KILN_F32:
		if (isfinite(v) && fabs(v) > FLT_MAX) /* may round to FLT_MAX or inf */
			v = round_to(v, 23, -126, 0x1p128);
		((float *)p)[i] = (float)v;
		break;
	case KILN_F64: ((double *)p)[i] = v; break;
	case KILN_F16: ((uint16_t *)p)[i] = double_to_half(v); break;
	case KILN_BF16: ((uint16_t *)p)[i] = double_to_bf16(v); break;
	case KILN_I8: ((int8_t *)p)[i] = (int8_t)sat_i64(v, INT8_MIN, INT8_MAX); break;
	case KILN_U8: ((uint8_t *)p)[i] = (uint8_t)sat_i64(v, 0, UINT8_MAX); break;
	case KILN_I32: ((int32_t *)p)[i] = (int32_t)sat_i64(v, INT32_MIN, INT32_MAX); break;
	case KILN_I64: ((int64_t *)p)[i] = sat_i64(v, -0x1p63, 0x1p63); break;
	case KILN_BOOL: ((uint8_t *)p)[i] = v != 0; break; /* NaN is true */
	default: break;
	}
}

int64_t ir_load_i64(const kiln_tensor *t, int64_t i)
{
	const void *p = t->data;
	switch (t->dtype) {
	case KILN_I8: return ((const int8_t *)p)[i];
	case KILN_U8: return ((const uint8_t *)p)[i];
	case KILN_I32: return ((const int32_t *)p)[i];
	case KILN_I64: return ((const int64_t *)p)[i];
	case KILN_BOOL: return ((const uint8_t *)p)[i] != 0;
	default: return sat_i64(ir_load(t, i), -0x1p63, 0x1p63);
	}
}

/* Integer to integer wraps (two's complement, as numpy's astype does). */
void ir_store_i64(kiln_tensor *t, int64_t i, int64_t v)
{
	void *p = t->data;
	switch (t->dtype) {
	case KILN_I8: ((int8_t *)p)[i] = (int8_t)(uint8_t)v; break;
	case KILN_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
	case KILN_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)v; break;
	case KILN_I64: ((int64_t *)p)[i] = v; break;
	case KILN_BOOL: ((uint8_t *)p)[i] = v != 0; break;
	case KILN_F32: ((float *)p)[i] = (float)v; break; /* one rounding */
	default: ir_store(t, i, (double)v); break;
	}
}

/* ---- kernel helpers ------------------------------------------------------ */

/* Like ir_errorf, but into the run's kiln_error: the graph is const here. */
kiln_status ir_fail(ir_interp *c, const ir_node *n, kiln_status code, const char *fmt, ...)
{
	char head[512] = "", d[160];
	size_t k = 0;
	if (n && n->loc.file)
		k += snprintf(head, sizeof head, "%s:%d: ", n->loc.file, n->loc.line);
	if (n && k < sizeof head)
		snprintf(head + k, sizeof head - k, "%s: ", ir_node_desc(n, d, sizeof d));
	if (c->err) {
		char body[512];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(body, sizeof body, fmt, ap);
		va_end(ap);
		ir_seterr(c->err, code, "%s%s", head, body);
	}
	return code;
}

bool ir_isint(kiln_dtype dt)
{
	return !kiln_dtype_is_float(dt);
}

/* "f32[2,3]" for a concrete tensor, for messages. */
const char *ir_tstr(const kiln_tensor *t, char *buf, size_t size)
{
	size_t k = snprintf(buf, size, "%s[", kiln_dtype_name(t->dtype));
	for (int d = 0; d < t->rank && k < size; d++)
		k += snprintf(buf + k, size - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
	if (k < size)
		snprintf(buf + k, size - k, "]");
	return buf;
}

int64_t ir_prod(const int64_t *dims, int from, int to)
{
	int64_t p = 1;
	for (int d = from; d < to; d++)
		p *= dims[d];
	return p;
}

/* Row-major coordinates of linear index i in shape[0..rank). */
void ir_unravel(int64_t i, int rank, const int64_t *shape, int64_t *idx)
{
	for (int d = rank - 1; d >= 0; d--) {
		idx[d] = shape[d] ? i % shape[d] : 0;
		i = shape[d] ? i / shape[d] : 0;
	}
}

/* Strides of t broadcast to out's shape (right-aligned, 0 on a broadcast
 * dim); false when t does not broadcast to out. */
bool ir_bstrides(const kiln_tensor *t, const kiln_tensor *out, int64_t *st)
{
	int off = out->rank - t->rank;
	int64_t s = 1;
	if (off < 0)
		return false;
	for (int d = out->rank - 1; d >= 0; d--) {
		int64_t td = d >= off ? t->shape[d - off] : 1;
		if (td != 1 && td != out->shape[d])
			return false;
		st[d] = td == 1 ? 0 : s;
		s *= td;
	}
	return true;
}

/* Offset into a tensor with broadcast strides st of out's element i. */
int64_t ir_boff(const kiln_tensor *out, const int64_t *st, int64_t i)
{
	int64_t o = 0;
	for (int d = out->rank - 1; d >= 0; d--) {
		o += (i % out->shape[d]) * st[d];
		i /= out->shape[d];
	}
	return o;
}

int64_t ir_naxis(int64_t axis, int rank)
{
	return axis < 0 ? axis + rank : axis;
}

/* Copies element si of src to element di of dst (same dtype). */
static void copy_elem(kiln_tensor *dst, int64_t di, const kiln_tensor *src, int64_t si)
{
	size_t es = kiln_dtype_size(src->dtype);
	memcpy((char *)dst->data + di * es, (const char *)src->data + si * es, es);
}

static kiln_status same_dtype(ir_interp *c, const ir_node *n, const kiln_tensor *a,
                              const kiln_tensor *b)
{
	if (a->dtype == b->dtype)
		return KILN_OK;
	char x[96], y[96];
	return ir_fail(c, n, KILN_ESHAPE, "dtype changes from %s to %s in a move op",
	                      ir_tstr(a, x, sizeof x), ir_tstr(b, y, sizeof y));
}

/* ---- elementwise unary -------------------------------------------------- */

static double neg(double x) { return -x; }
static double recip(double x) { return 1.0 / x; }
static double relu(double x) { return x > 0 ? x : isnan(x) ? x : 0; }
static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

static double (*const unary_fn[KILN_OP_COUNT])(double) = {
	[KILN_OP_NEG] = neg,    [KILN_OP_ABS] = fabs,   [KILN_OP_EXP] = exp,
	[KILN_OP_LOG] = log,    [KILN_OP_SQRT] = sqrt,  [KILN_OP_RECIPROCAL] = recip,
	[KILN_OP_FLOOR] = floor, [KILN_OP_CEIL] = ceil, [KILN_OP_ROUND] = nearbyint, [KILN_OP_SIN] = sin,
	[KILN_OP_COS] = cos, [KILN_OP_ATAN] = atan, [KILN_OP_ASIN] = asin, [KILN_OP_ACOS] = acos,    [KILN_OP_RELU] = relu,  [KILN_OP_SIGMOID] = sigmoid,
	[KILN_OP_TANH] = tanh,  [KILN_OP_ERF] = erf,
};

/* Integer versions wrap like two's complement instead of overflowing. */
static int64_t negi(int64_t x) { return (int64_t)(0 - (uint64_t)x); }
static int64_t absi(int64_t x) { return x < 0 ? negi(x) : x; }
static int64_t relui(int64_t x) { return x > 0 ? x : 0; }

static int64_t (*const unary_int[KILN_OP_COUNT])(int64_t) = {
	[KILN_OP_NEG] = negi, [KILN_OP_ABS] = absi, [KILN_OP_RELU] = relui,
};

static kiln_status unary(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                         kiln_tensor *const *out)
{
	int64_t cnt = kiln_tensor_numel(out[0]);
	if (kiln_tensor_numel(in[0]) != cnt)
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	if (ir_isint(in[0]->dtype) && unary_int[n->op]) {
		for (int64_t i = 0; i < cnt; i++)
			ir_store_i64(out[0], i, unary_int[n->op](ir_load_i64(in[0], i)));
		return KILN_OK;
	}
	for (int64_t i = 0; i < cnt; i++)
		ir_store(out[0], i, unary_fn[n->op](ir_load(in[0], i)));
	return KILN_OK;
}

/* Unary maps with parameters read from attributes once per node. */
typedef double (*fn1p)(double x, const double *p);

static kiln_status map1p(ir_interp *c, const ir_node *n, const kiln_tensor *x,
                         kiln_tensor *y, fn1p f, const double *p)
{
	int64_t cnt = kiln_tensor_numel(y);
	if (kiln_tensor_numel(x) != cnt)
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	for (int64_t i = 0; i < cnt; i++)
		ir_store(y, i, f(ir_load(x, i), p));
	return KILN_OK;
}

/* An op with a formula in ir_scalar_table (Gelu, Softplus, ...): the
 * formula evaluated in double per element. */
static kiln_status formula(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out)
{
	ir_sexpr e;
	kiln_status st = ir_scalar_build(n, &e);
	if (st == KILN_EINVAL)
		return ir_fail(c, n, st, "attributes the op's formula does not take");
	if (st)
		return ir_fail(c, n, st, "cannot build the op's formula");
	int64_t cnt = kiln_tensor_numel(out[0]);
	if (kiln_tensor_numel(in[0]) != cnt)
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	for (int64_t i = 0; i < cnt; i++)
		ir_store(out[0], i, ir_scalar_eval(&e, ir_load(in[0], i)));
	return KILN_OK;
}

/* Clip's absent bounds are unbounded; NaN passes through. */
static double clamp(double x, const double *p) { return x < p[0] ? p[0] : x > p[1] ? p[1] : x; }

static kiln_status clip(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                        kiln_tensor *const *out)
{
	double p[2] = {ir_attr_float(n, "min", -INFINITY), ir_attr_float(n, "max", INFINITY)};
	if (!ir_isint(in[0]->dtype))
		return map1p(c, n, in[0], out[0], clamp, p);
	if (kiln_tensor_numel(in[0]) != kiln_tensor_numel(out[0]))
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	int64_t lo = sat_i64(ceil(p[0]), -0x1p63, 0x1p63), hi = sat_i64(floor(p[1]), -0x1p63, 0x1p63);
	for (int64_t i = 0, cnt = kiln_tensor_numel(out[0]); i < cnt; i++) {
		int64_t x = ir_load_i64(in[0], i);
		ir_store_i64(out[0], i, x < lo ? lo : x > hi ? hi : x);
	}
	return KILN_OK;
}

static kiln_status not_op(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	if (kiln_tensor_numel(in[0]) != kiln_tensor_numel(out[0]))
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	for (int64_t i = 0, cnt = kiln_tensor_numel(out[0]); i < cnt; i++)
		ir_store_i64(out[0], i, !ir_load_i64(in[0], i));
	return KILN_OK;
}

/* Integer sources go through int64 so i64 -> i32 wraps and i64 -> f32
 * rounds once; float sources go through double, truncating toward zero
 * into integers and mapping nonzero (NaN included) to true. */
static kiln_status cast(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                        kiln_tensor *const *out)
{
	int64_t cnt = kiln_tensor_numel(out[0]);
	if (kiln_tensor_numel(in[0]) != cnt)
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	for (int64_t i = 0; i < cnt; i++) {
		if (ir_isint(in[0]->dtype))
			ir_store_i64(out[0], i, ir_load_i64(in[0], i));
		else
			ir_store(out[0], i, ir_load(in[0], i));
	}
	return KILN_OK;
}

/* Identity, Reshape, Flatten, Squeeze, Unsqueeze: the bytes do not move. */
static kiln_status copy(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                        kiln_tensor *const *out)
{
	kiln_status st = same_dtype(c, n, in[0], out[0]);
	if (st)
		return st;
	if (kiln_tensor_numel(in[0]) != kiln_tensor_numel(out[0])) {
		char a[96], b[96];
		return ir_fail(c, n, KILN_ESHAPE, "cannot view %s as %s",
		                      ir_tstr(in[0], a, sizeof a), ir_tstr(out[0], b, sizeof b));
	}
	memcpy(out[0]->data, in[0]->data, kiln_tensor_nbytes(in[0]));
	return KILN_OK;
}

/* ---- elementwise binary, NumPy broadcasting ----------------------------- */

static double add(double a, double b) { return a + b; }
static double sub(double a, double b) { return a - b; }
static double mul(double a, double b) { return a * b; }
static double divd(double a, double b) { return a / b; }
/* Max and Min propagate NaN, as torch.maximum and ONNX do. */
double ir_maxd(double a, double b) { return a > b || isnan(a) ? a : b; }
static double mind(double a, double b) { return a < b || isnan(a) ? a : b; }
static double eq(double a, double b) { return a == b; }
static double lt(double a, double b) { return a < b; }
static double gt(double a, double b) { return a > b; }

static double (*const binary_fn[KILN_OP_COUNT])(double, double) = {
	[KILN_OP_ADD] = add, [KILN_OP_SUB] = sub, [KILN_OP_MUL] = mul, [KILN_OP_DIV] = divd,
	[KILN_OP_POW] = pow, [KILN_OP_MAX] = ir_maxd, [KILN_OP_MIN] = mind,
	[KILN_OP_EQUAL] = eq, [KILN_OP_LESS] = lt, [KILN_OP_GREATER] = gt,
};

/* Integer arithmetic wraps through uint64_t, never overflowing; Div
 * truncates toward zero (the caller rejects a zero divisor). */
static int64_t addi(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t subi(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static int64_t muli(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static int64_t divi(int64_t a, int64_t b) { return b == -1 ? negi(a) : a / b; }
static int64_t maxi(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t mini(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t eqi(int64_t a, int64_t b) { return a == b; }
static int64_t lti(int64_t a, int64_t b) { return a < b; }
static int64_t gti(int64_t a, int64_t b) { return a > b; }
static int64_t andi(int64_t a, int64_t b) { return a && b; }

/* Integer powers wrap like the other integer ops (numpy's), exact where a
 * double's pow would round; a negative exponent gives 1 / a^-b truncated
 * toward zero: 0 unless |a| is 1. */
static int64_t powi(int64_t a, int64_t b)
{
	if (b < 0)
		return a == 1 ? 1 : a == -1 ? (b & 1 ? -1 : 1) : 0;
	uint64_t r = 1, x = (uint64_t)a;
	for (; b; b >>= 1, x *= x)
		if (b & 1)
			r *= x;
	return (int64_t)r;
}
static int64_t ori(int64_t a, int64_t b) { return a || b; }

static int64_t (*const binary_int[KILN_OP_COUNT])(int64_t, int64_t) = {
	[KILN_OP_ADD] = addi, [KILN_OP_SUB] = subi, [KILN_OP_MUL] = muli, [KILN_OP_DIV] = divi,
	[KILN_OP_POW] = powi, [KILN_OP_MAX] = maxi, [KILN_OP_MIN] = mini, [KILN_OP_EQUAL] = eqi, [KILN_OP_LESS] = lti,
	[KILN_OP_GREATER] = gti, [KILN_OP_AND] = andi, [KILN_OP_OR] = ori,
};

kiln_status ir_bcast_fail(ir_interp *c, const ir_node *n, const kiln_tensor *t,
                          const kiln_tensor *out)
{
	char a[96], b[96];
	return ir_fail(c, n, KILN_ESHAPE, "%s does not broadcast to %s", ir_tstr(t, a, sizeof a),
	               ir_tstr(out, b, sizeof b));
}

/* Folds inputs left to right at each output index: Add..Or, and the
 * variadic Max/Min (one input is a broadcast copy). */
static kiln_status binary(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	kiln_tensor *y = out[0];
	int64_t (*st)[KILN_MAX_RANK] = calloc(n->nin, sizeof *st);
	if (!st)
		return ir_fail(c, n, KILN_ENOMEM, "out of memory");
	bool ints = binary_int[n->op] != NULL;
	kiln_status rc = KILN_OK;
	for (uint32_t k = 0; k < n->nin && !rc; k++) {
		if (!ir_bstrides(in[k], y, st[k]))
			rc = ir_bcast_fail(c, n, in[k], y);
		ints = ints && ir_isint(in[k]->dtype);
	}
	for (int64_t i = 0, cnt = kiln_tensor_numel(y); i < cnt && !rc; i++) {
		if (ints) {
			int64_t acc = ir_load_i64(in[0], ir_boff(y, st[0], i));
			for (uint32_t k = 1; k < n->nin && !rc; k++) {
				int64_t b = ir_load_i64(in[k], ir_boff(y, st[k], i));
				if (n->op == KILN_OP_DIV && b == 0)
					rc = ir_fail(c, n, KILN_EINVAL, "integer division by zero");
				else
					acc = binary_int[n->op](acc, b);
			}
			ir_store_i64(y, i, acc);
		} else {
			double acc = ir_load(in[0], ir_boff(y, st[0], i));
			for (uint32_t k = 1; k < n->nin; k++)
				acc = binary_fn[n->op](acc, ir_load(in[k], ir_boff(y, st[k], i)));
			ir_store(y, i, acc);
		}
	}
	free(st);
	return rc;
}

static kiln_status where(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                         kiln_tensor *const *out)
{
	int64_t st[3][KILN_MAX_RANK];
	for (int k = 0; k < 3; k++)
		if (!ir_bstrides(in[k], out[0], st[k]))
			return ir_bcast_fail(c, n, in[k], out[0]);
	kiln_status rc = same_dtype(c, n, in[1], out[0]);
	if (!rc)
		rc = same_dtype(c, n, in[2], out[0]);
	for (int64_t i = 0, cnt = kiln_tensor_numel(out[0]); i < cnt && !rc; i++) {
		int k = ir_load_i64(in[0], ir_boff(out[0], st[0], i)) ? 1 : 2;
		copy_elem(out[0], i, in[k], ir_boff(out[0], st[k], i));
	}
	return rc;
}

/* ---- reductions --------------------------------------------------------- */

/* One reduction: its start value and step, in double and in int64. */
typedef struct reducer {
	double init;
	double (*f)(double, double);
	int64_t initi;
	int64_t (*fi)(int64_t, int64_t);
	bool mean;
} reducer;

static const reducer reducers[KILN_OP_COUNT] = {
	[KILN_OP_REDUCE_SUM] = {0, add, 0, addi, false},
	[KILN_OP_REDUCE_MEAN] = {0, add, 0, addi, true},
	[KILN_OP_REDUCE_MAX] = {-INFINITY, ir_maxd, INT64_MIN, maxi, false},
	[KILN_OP_REDUCE_MIN] = {INFINITY, mind, INT64_MAX, mini, false},
	[KILN_OP_REDUCE_PROD] = {1, mul, 1, muli, false},
};

/* Marks the reduced axes; false means "no reduction" (empty axes with
 * noop_with_empty_axes), where the op is an identity. */
static kiln_status reduced_axes(ir_interp *c, const ir_node *n, int rank, bool *mask,
                                bool *noop)
{
	const int64_t *axes;
	uint32_t na = ir_attr_ints(n, "axes", &axes);
	*noop = na == 0 && ir_attr_int(n, "noop_with_empty_axes", 0);
	for (int d = 0; d < rank; d++)
		mask[d] = na == 0;
	for (uint32_t k = 0; k < na; k++) {
		int64_t a = ir_naxis(axes[k], rank);
		if (a < 0 || a >= rank)
			return ir_fail(c, n, KILN_EINVAL, "axis %lld out of range for rank %d",
			               (long long)axes[k], rank);
		mask[a] = true;
	}
	return KILN_OK;
}

/* The output index of input element i: its coordinates on kept axes, in
 * row-major order (the same whether or not reduced axes are kept as 1). */
static int64_t reduced_index(const kiln_tensor *x, const bool *mask, int64_t i)
{
	int64_t o = 0, s = 1;
	for (int d = x->rank - 1; d >= 0; d--) {
		int64_t coord = i % x->shape[d];
		i /= x->shape[d];
		if (!mask[d]) {
			o += coord * s;
			s *= x->shape[d];
		}
	}
	return o;
}

static kiln_status reduce(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	kiln_tensor *y = out[0];
	const reducer *r = &reducers[n->op];
	bool mask[KILN_MAX_RANK], noop;
	kiln_status rc = reduced_axes(c, n, x->rank, mask, &noop);
	if (rc || noop)
		return rc ? rc : copy(c, n, in, out);
	int64_t m = kiln_tensor_numel(y), cnt = kiln_tensor_numel(x), kept = 1;
	for (int d = 0; d < x->rank; d++)
		kept *= mask[d] ? 1 : x->shape[d];
	if (kept != m)
		return ir_fail(c, n, KILN_ESHAPE, "output has %lld elements, the kept axes %lld",
		               (long long)m, (long long)kept);
	int64_t per = m ? cnt / m : 0;
	bool ints = ir_isint(x->dtype) && !r->mean;
	double *acc = malloc((m + 1) * sizeof *acc);
	int64_t *acci = malloc((m + 1) * sizeof *acci);
	if (!acc || !acci) {
		free(acc), free(acci);
		return ir_fail(c, n, KILN_ENOMEM, "out of memory");
	}
	for (int64_t o = 0; o < m; o++)
		acc[o] = r->init, acci[o] = r->initi;
	for (int64_t i = 0; i < cnt; i++) {
		int64_t o = reduced_index(x, mask, i);
		if (ints)
			acci[o] = r->fi(acci[o], ir_load_i64(x, i));
		else
			acc[o] = r->f(acc[o], ir_load(x, i));
	}
	for (int64_t o = 0; o < m; o++) {
		if (ints)
			ir_store_i64(y, o, acci[o]);
		else
			ir_store(y, o, r->mean ? acc[o] / per : acc[o]);
	}
	free(acc), free(acci);
	return KILN_OK;
}

/* ArgMax: the first (or with select_last_index the last) maximum. */
static kiln_status argmax(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", 0), x->rank);
	bool last = ir_attr_int(n, "select_last_index", 0);
	if (axis < 0 || axis >= x->rank)
		return ir_fail(c, n, KILN_EINVAL, "axis out of range for rank %d", x->rank);
	int64_t outer = ir_prod(x->shape, 0, axis), len = x->shape[axis];
	int64_t inner = ir_prod(x->shape, axis + 1, x->rank);
	if (kiln_tensor_numel(out[0]) != outer * inner)
		return ir_fail(c, n, KILN_ESHAPE, "output size does not match the input");
	for (int64_t o = 0; o < outer; o++)
		for (int64_t k = 0; k < inner; k++) {
			int64_t best = 0, base = o * len * inner + k;
			for (int64_t j = 1; j < len; j++) {
				int64_t a = base + j * inner, b = base + best * inner;
				bool more, same;
				if (ir_isint(x->dtype)) {
					int64_t va = ir_load_i64(x, a), vb = ir_load_i64(x, b);
					more = va > vb, same = va == vb;
				} else {
					double va = ir_load(x, a), vb = ir_load(x, b);
					more = va > vb || (isnan(va) && !isnan(vb)), same = va == vb;
				}
				if (more || (last && same))
					best = j;
			}
			ir_store_i64(out[0], o * inner + k, best);
		}
	return KILN_OK;
}

/* ---- data movement ------------------------------------------------------ */

static kiln_status transpose(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                             kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	const int64_t *perm;
	int64_t p[KILN_MAX_RANK], st[KILN_MAX_RANK], idx[KILN_MAX_RANK];
	uint32_t np = ir_attr_ints(n, "perm", &perm);
	bool seen[KILN_MAX_RANK] = {0};
	for (int d = 0; d < x->rank; d++) {
		p[d] = np ? ir_naxis(perm[d], x->rank) : x->rank - 1 - d; /* default: reverse */
		if ((np && np != (uint32_t)x->rank) || p[d] < 0 || p[d] >= x->rank || seen[p[d]])
			return ir_fail(c, n, KILN_EINVAL, "perm is not a permutation of %d axes", x->rank);
		seen[p[d]] = true;
		if (out[0]->rank != x->rank || out[0]->shape[d] != x->shape[p[d]])
			return ir_fail(c, n, KILN_ESHAPE, "output is not the permuted input");
	}
	for (int d = x->rank - 1; d >= 0; d--)
		st[d] = d == x->rank - 1 ? 1 : st[d + 1] * x->shape[d + 1];
	kiln_status rc = same_dtype(c, n, x, out[0]);
	for (int64_t i = 0, cnt = kiln_tensor_numel(out[0]); i < cnt && !rc; i++) {
		ir_unravel(i, out[0]->rank, out[0]->shape, idx);
		int64_t off = 0;
		for (int d = 0; d < x->rank; d++)
			off += idx[d] * st[p[d]];
		copy_elem(out[0], i, x, off);
	}
	return rc;
}

/* Concat and Split move whole [axis..] blocks: per outer index, each piece
 * contributes shape[axis] * inner contiguous elements. */
static kiln_status blocks(ir_interp *c, const ir_node *n, const kiln_tensor *whole,
                          kiln_tensor *const *parts, uint32_t nparts, bool split)
{
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", 0), whole->rank);
	if (axis < 0 || axis >= whole->rank)
		return ir_fail(c, n, KILN_EINVAL, "axis out of range for rank %d", whole->rank);
	int64_t outer = ir_prod(whole->shape, 0, axis), inner = ir_prod(whole->shape, axis + 1, whole->rank);
	int64_t total = 0;
	size_t es = kiln_dtype_size(whole->dtype);
	for (uint32_t k = 0; k < nparts; k++) {
		kiln_status rc = same_dtype(c, n, parts[k], whole);
		if (rc)
			return rc;
		if (parts[k]->rank != whole->rank ||
		    kiln_tensor_numel(parts[k]) != outer * parts[k]->shape[axis] * inner)
			return ir_fail(c, n, KILN_ESHAPE, "piece %u does not fit the axis-%lld layout", k,
			               (long long)axis);
		total += parts[k]->shape[axis];
	}
	if (total != whole->shape[axis])
		return ir_fail(c, n, KILN_ESHAPE, "pieces sum to %lld along axis %lld, not %lld",
		               (long long)total, (long long)axis, (long long)whole->shape[axis]);
	char *w = whole->data;
	for (int64_t o = 0, at = 0; o < outer; o++)
		for (uint32_t k = 0; k < nparts; k++) {
			size_t len = parts[k]->shape[axis] * inner * es;
			char *p = (char *)parts[k]->data + o * len;
			memcpy(split ? p : w + at, split ? w + at : p, len);
			at += len;
		}
	return KILN_OK;
}

static kiln_status concat(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	return blocks(c, n, out[0], in, n->nin, false);
}

static kiln_status split(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                         kiln_tensor *const *out)
{
	return blocks(c, n, in[0], out, n->nout, true);
}

/* Slice: only each axis's first index and step matter, the output shape
 * giving the count; starts clamp to [0, dim] (step > 0) or [0, dim-1]. */
static kiln_status slice(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                         kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	const int64_t *starts, *ends, *axes, *steps;
	uint64_t sd, ed;
	uint32_t ns = ir_attr_dims(n, "starts", &starts, &sd), ne = ir_attr_dims(n, "ends", &ends, &ed);
	uint32_t na = ir_attr_ints(n, "axes", &axes), nst = ir_attr_ints(n, "steps", &steps);
	if (ne != ns || (na && na != ns) || (nst && nst != ns) || out[0]->rank != x->rank)
		return ir_fail(c, n, KILN_EINVAL, "starts, ends, axes and steps differ in length");
	int64_t first[KILN_MAX_RANK] = {0}, step[KILN_MAX_RANK], idx[KILN_MAX_RANK];
	for (int d = 0; d < x->rank; d++)
		step[d] = 1;
	for (uint32_t k = 0; k < ns; k++) {
		int64_t a = ir_naxis(na ? axes[k] : (int64_t)k, x->rank), dim;
		if (a < 0 || a >= x->rank || (nst && steps[k] == 0))
			return ir_fail(c, n, KILN_EINVAL, "bad axis or zero step at position %u", k);
		dim = x->shape[a];
		step[a] = nst ? steps[k] : 1;
		int64_t s = starts[k];
		if ((sd | ed) >> k & 1) { /* [0:E:1] with E a dim (shape_slice): E <= dim */
			int64_t e = c->sym ? ir_dim_eval(c->g, ends[k], c->sym) : -1;
			char es[96], xs[96];
			if (e < 0 || (sd >> k & 1))
				return ir_fail(c, n, KILN_EINVAL, "symbolic start or end at position %u "
				               "with no size bound to it", k);
			if (e > dim)
				return ir_fail(c, n, KILN_ESHAPE, "end %s=%lld is past the %lld of axis "
				               "%lld of %s; the graph takes %s <= %lld",
				               ir_dim_str(c->g, ends[k], es, sizeof es), (long long)e,
				               (long long)dim, (long long)a, ir_tstr(x, xs, sizeof xs), es,
				               (long long)dim);
		}
		s = s < 0 ? s + dim : s;
		int64_t hi = step[a] > 0 ? dim : dim - 1;
		first[a] = s < 0 ? 0 : s > hi ? hi : s;
	}
	kiln_status rc = same_dtype(c, n, x, out[0]);
	int64_t cnt = kiln_tensor_numel(out[0]);
	for (int64_t i = 0; i < cnt && !rc; i++) {
		ir_unravel(i, x->rank, out[0]->shape, idx);
		int64_t off = 0;
		for (int d = 0; d < x->rank; d++) {
			int64_t j = first[d] + idx[d] * step[d];
			if (j < 0 || j >= x->shape[d])
				return ir_fail(c, n, KILN_ESHAPE, "output shape reads outside axis %d", d);
			off = off * x->shape[d] + j;
		}
		copy_elem(out[0], i, x, off);
	}
	return rc;
}

/* Gather: negative indices count from the end; one out of range is an
 * error, never a read outside the data. */
static kiln_status gather(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *ix = in[1];
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", 0), x->rank);
	if (axis < 0 || axis >= x->rank || !ir_isint(ix->dtype))
		return ir_fail(c, n, KILN_EINVAL, "bad axis or non-integer indices");
	int64_t outer = ir_prod(x->shape, 0, axis), dim = x->shape[axis];
	int64_t inner = ir_prod(x->shape, axis + 1, x->rank), ni = kiln_tensor_numel(ix);
	kiln_status rc = same_dtype(c, n, x, out[0]);
	if (!rc && kiln_tensor_numel(out[0]) != outer * ni * inner)
		rc = ir_fail(c, n, KILN_ESHAPE, "output size does not match data and indices");
	for (int64_t j = 0; j < ni && !rc; j++) {
		int64_t v = ir_load_i64(ix, j), at = v < 0 ? v + dim : v;
		if (at < 0 || at >= dim) {
			char a[96];
			return ir_fail(c, n, KILN_EINVAL, "index %lld out of range for axis %lld of %s",
			               (long long)v, (long long)axis, ir_tstr(x, a, sizeof a));
		}
		for (int64_t o = 0; o < outer; o++)
			for (int64_t k = 0; k < inner; k++)
				copy_elem(out[0], (o * ni + j) * inner + k, x, (o * dim + at) * inner + k);
	}
	return rc;
}

/* out[c] = x[c with its axis coordinate replaced by indices[c]]: out has
 * the indices' shape, no larger than x's but along the axis. */
static kiln_status gather_elements(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                   kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *ix = in[1];
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", 0), x->rank);
	kiln_status rc = same_dtype(c, n, x, out[0]);
	if (axis < 0 || axis >= x->rank || !ir_isint(ix->dtype) || ix->rank != x->rank)
		return ir_fail(c, n, KILN_EINVAL, "bad axis, non-integer indices or ranks that differ");
	int64_t coord[KILN_MAX_RANK] = {0}, dim = x->shape[axis];
	for (int64_t i = 0, cnt = kiln_tensor_numel(ix); i < cnt && !rc; i++) {
		int64_t rest = i, xi = 0;
		for (int d = ix->rank - 1; d >= 0; d--)
			coord[d] = rest % ix->shape[d], rest /= ix->shape[d];
		int64_t v = ir_load_i64(ix, i), at = v < 0 ? v + dim : v;
		if (at < 0 || at >= dim) {
			char a[96];
			return ir_fail(c, n, KILN_EINVAL, "index %lld out of range for axis %lld of %s",
			               (long long)v, (long long)axis, ir_tstr(x, a, sizeof a));
		}
		for (int d = 0; d < x->rank; d++) {
			if (d != axis && coord[d] >= x->shape[d])
				return ir_fail(c, n, KILN_ESHAPE, "indices are larger than data off the axis");
			xi = xi * x->shape[d] + (d == axis ? at : coord[d]);
		}
		copy_elem(out[0], i, x, xi);
	}
	return rc;
}

/* TopK: per slice along the axis, the k best by (value, then the lower
 * index first), in that order: a selection by that total order. */
static kiln_status topk(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                        kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", -1), x->rank), k = ir_attr_int(n, "k", 0);
	bool largest = ir_attr_int(n, "largest", 1) != 0;
	kiln_status rc = same_dtype(c, n, x, out[0]);
	if (rc || axis < 0 || axis >= x->rank || k < 0 || k > x->shape[axis])
		return rc ? rc : ir_fail(c, n, KILN_EINVAL, "bad axis or k");
	int64_t outer = ir_prod(x->shape, 0, axis), len = x->shape[axis];
	int64_t inner = ir_prod(x->shape, axis + 1, x->rank);
	for (int64_t o = 0; o < outer; o++)
		for (int64_t in_ = 0; in_ < inner; in_++) {
			double pv = 0;
			int64_t pi = -1;
			for (int64_t j = 0; j < k; j++) {
				double best = 0;
				int64_t bi = -1;
				for (int64_t i = 0; i < len; i++) {
					double v = ir_load(x, (o * len + i) * inner + in_);
					bool after = pi < 0 || (largest ? v < pv : v > pv) || (v == pv && i > pi);
					bool better = bi < 0 || (largest ? v > best : v < best);
					if (after && better)
						best = v, bi = i;
				}
				int64_t oi = (o * k + j) * inner + in_;
				copy_elem(out[0], oi, x, (o * len + bi) * inner + in_);
				ir_store_i64(out[1], oi, bi);
				pv = best, pi = bi;
			}
		}
	return KILN_OK;
}

/* out = x, then each update written (or added, multiplied) at its place. */
static void scatter_put(kiln_tensor *out, int64_t oi, const kiln_tensor *u, int64_t ui, int red)
{
	if (red == 0) {
		copy_elem(out, oi, u, ui);
	} else if (!kiln_dtype_is_float(out->dtype)) {
		int64_t a = ir_load_i64(out, oi), b = ir_load_i64(u, ui);
		ir_store_i64(out, oi, red == 1 ? addi(a, b) : muli(a, b));
	} else {
		double a = ir_load(out, oi), b = ir_load(u, ui);
		ir_store(out, oi, red == 1 ? a + b : a * b);
	}
}

static int reduction_of(const ir_node *n)
{
	const char *r = ir_attr_str(n, "reduction", "none");
	return !strcmp(r, "add") ? 1 : !strcmp(r, "mul") ? 2 : 0;
}

static kiln_status index_fail(ir_interp *c, const ir_node *n, int64_t v, int64_t axis,
                              const kiln_tensor *x)
{
	char a[96];
	return ir_fail(c, n, KILN_EINVAL, "index %lld out of range for axis %lld of %s", (long long)v,
	               (long long)axis, ir_tstr(x, a, sizeof a));
}

static kiln_status scatter_elements(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                    kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *ix = in[1], *u = in[2];
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", 0), x->rank), coord[KILN_MAX_RANK];
	kiln_status rc = same_dtype(c, n, x, out[0]);
	if (rc || axis < 0 || axis >= x->rank || ix->rank != x->rank)
		return rc ? rc : ir_fail(c, n, KILN_EINVAL, "bad axis or ranks");
	memcpy(out[0]->data, x->data, kiln_tensor_nbytes(x));
	int red = reduction_of(n);
	for (int64_t i = 0, cnt = kiln_tensor_numel(ix); i < cnt; i++) {
		ir_unravel(i, ix->rank, ix->shape, coord);
		int64_t v = ir_load_i64(ix, i), at = v < 0 ? v + x->shape[axis] : v, oi = 0;
		if (at < 0 || at >= x->shape[axis])
			return index_fail(c, n, v, axis, x);
		for (int d = 0; d < x->rank; d++) {
			int64_t k = d == axis ? at : coord[d];
			if (k >= x->shape[d])
				return ir_fail(c, n, KILN_ESHAPE, "indices are larger than data off the axis");
			oi = oi * x->shape[d] + k;
		}
		scatter_put(out[0], oi, u, i, red);
	}
	return KILN_OK;
}

static kiln_status scatter_nd(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                              kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *ix = in[1], *u = in[2];
	kiln_status rc = same_dtype(c, n, x, out[0]);
	int64_t k = ix->rank ? ix->shape[ix->rank - 1] : 0;
	if (rc || k < 1 || k > x->rank)
		return rc ? rc : ir_fail(c, n, KILN_EINVAL, "bad index length");
	memcpy(out[0]->data, x->data, kiln_tensor_nbytes(x));
	int64_t q = kiln_tensor_numel(ix) / k, s = ir_prod(x->shape, (int)k, x->rank);
	int red = reduction_of(n);
	for (int64_t i = 0; i < q; i++) {
		int64_t base = 0;
		for (int64_t j = 0; j < k; j++) {
			int64_t v = ir_load_i64(ix, i * k + j), at = v < 0 ? v + x->shape[j] : v;
			if (at < 0 || at >= x->shape[j])
				return index_fail(c, n, v, j, x);
			base = base * x->shape[j] + at;
		}
		for (int64_t e = 0; e < s; e++)
			scatter_put(out[0], base * s + e, u, i * s + e, red);
	}
	return KILN_OK;
}

static kiln_status expand(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	int64_t st[KILN_MAX_RANK];
	if (!ir_bstrides(in[0], out[0], st))
		return ir_bcast_fail(c, n, in[0], out[0]);
	kiln_status rc = same_dtype(c, n, in[0], out[0]);
	for (int64_t i = 0, cnt = kiln_tensor_numel(out[0]); i < cnt && !rc; i++)
		copy_elem(out[0], i, in[0], ir_boff(out[0], st, i));
	return rc;
}

/* Where padding coordinate j (outside [0, dim)) reads from: reflect mirrors
 * without repeating the edge, edge clamps; -1 for constant. */
static int64_t pad_source(int mode, int64_t j, int64_t dim)
{
	if (mode == 0)
		return -1;
	if (mode == 2 || dim == 1)
		return j < 0 ? 0 : dim - 1;
	while (j < 0 || j >= dim) /* reflect; pads wider than dim bounce again */
		j = j < 0 ? -j : 2 * (dim - 1) - j;
	return j;
}

static kiln_status pad(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                       kiln_tensor *const *out)
{
	static const char *const modes[] = {"constant", "reflect", "edge"};
	const kiln_tensor *x = in[0];
	const int64_t *pads;
	uint32_t np = ir_attr_ints(n, "pads", &pads);
	const char *m = ir_attr_str(n, "mode", "constant");
	int mode = 0;
	while (mode < 3 && strcmp(m, modes[mode]))
		mode++;
	if (mode == 3)
		return ir_fail(c, n, KILN_EUNSUPPORTED, "pad mode '%s' (constant, reflect, edge)", m);
	if (np != 2 * (uint32_t)x->rank || out[0]->rank != x->rank)
		return ir_fail(c, n, KILN_EINVAL, "pads has %u entries, need %d", np, 2 * x->rank);
	double value = ir_attr_float(n, "value", 0);
	int64_t idx[KILN_MAX_RANK];
	kiln_status rc = same_dtype(c, n, x, out[0]);
	for (int64_t i = 0, cnt = kiln_tensor_numel(out[0]); i < cnt && !rc; i++) {
		ir_unravel(i, x->rank, out[0]->shape, idx);
		int64_t off = 0;
		for (int d = 0; d < x->rank && off >= 0; d++) {
			int64_t j = idx[d] - pads[d];
			if ((j < 0 || j >= x->shape[d]) && x->shape[d] > 0)
				j = pad_source(mode, j, x->shape[d]);
			else if (j < 0 || j >= x->shape[d])
				j = -1; /* an empty axis pads with the constant */
			off = j < 0 ? -1 : off * x->shape[d] + j;
		}
		if (off < 0)
			ir_store(out[0], i, value);
		else
			copy_elem(out[0], i, x, off);
	}
	return rc;
}

static kiln_status shape(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                         kiln_tensor *const *out)
{
	int r = in[0]->rank;
	int64_t start = ir_attr_int(n, "start", 0), end = ir_attr_int(n, "end", r);
	start = ir_naxis(start, r), end = ir_naxis(end, r);
	start = start < 0 ? 0 : start > r ? r : start;
	end = end < start ? start : end > r ? r : end;
	if (kiln_tensor_numel(out[0]) != end - start)
		return ir_fail(c, n, KILN_ESHAPE, "output has %lld entries, not %lld",
		               (long long)kiln_tensor_numel(out[0]), (long long)(end - start));
	for (int64_t k = start; k < end; k++)
		ir_store_i64(out[0], k - start, in[0]->shape[k]);
	return KILN_OK;
}

static kiln_status constant(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                            kiln_tensor *const *out)
{
	const ir_attr *a = ir_attr_get(n, "value");
	if (!a || a->kind != IR_A_TENSOR)
		return ir_fail(c, n, KILN_EINVAL, "missing tensor attribute 'value'");
	kiln_status rc = same_dtype(c, n, a->u.t, out[0]);
	if (!rc && kiln_tensor_numel(a->u.t) != kiln_tensor_numel(out[0]))
		rc = ir_fail(c, n, KILN_ESHAPE, "value and output sizes differ");
	if (!rc)
		memcpy(out[0]->data, a->u.t->data, kiln_tensor_nbytes(out[0]));
	return rc;
}

/* Range: the output's length is n (bound by the run); each element
 * computed in double from i, as ONNX defines it, not by accumulating. */
static kiln_status range(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                         kiln_tensor *const *out)
{
	double start = ir_attr_float(n, "start", 0), delta = ir_attr_float(n, "delta", 1);
	int64_t cnt = kiln_tensor_numel(out[0]);
	(void)c, (void)in;
	for (int64_t i = 0; i < cnt; i++)
		ir_store(out[0], i, start + (double)i * delta);
	return KILN_OK;
}

/* ---- linear algebra ----------------------------------------------------- */

/* MatMul with NumPy semantics: a 1-D a is [1,K] and a 1-D b is [K,1] with
 * that dim dropped from the result; batch dims broadcast.  The output's
 * leading nb dims are the broadcast batch, so its row-major layout is
 * [batch, M, N] whichever of M and N were dropped. */
static kiln_status matmul(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	const kiln_tensor *a = in[0], *b = in[1];
	kiln_tensor *y = out[0];
	if (a->rank < 1 || b->rank < 1)
		return ir_fail(c, n, KILN_ESHAPE, "MatMul of a scalar");
	bool a1 = a->rank == 1, b1 = b->rank == 1;
	int64_t M = a1 ? 1 : a->shape[a->rank - 2], K = a->shape[a->rank - 1];
	int64_t N = b1 ? 1 : b->shape[b->rank - 1], Kb = b1 ? b->shape[0] : b->shape[b->rank - 2];
	int nb = y->rank - !a1 - !b1;
	if (K != Kb || nb < 0 || nb < a->rank - 2 || nb < b->rank - 2 ||
	    kiln_tensor_numel(y) != ir_prod(y->shape, 0, nb) * M * N) {
		char x1[96], x2[96];
		return ir_fail(c, n, KILN_ESHAPE, "cannot multiply %s by %s", ir_tstr(a, x1, sizeof x1),
		               ir_tstr(b, x2, sizeof x2));
	}
	/* batch views of a and b, broadcast against y's batch dims */
	kiln_tensor batch = {.rank = nb}, av = {.rank = a1 ? 0 : a->rank - 2},
		    bv = {.rank = b1 ? 0 : b->rank - 2};
	memcpy(batch.shape, y->shape, nb * sizeof(int64_t));
	memcpy(av.shape, a->shape, av.rank * sizeof(int64_t));
	memcpy(bv.shape, b->shape, bv.rank * sizeof(int64_t));
	int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK];
	if (!ir_bstrides(&av, &batch, sa) || !ir_bstrides(&bv, &batch, sb))
		return ir_fail(c, n, KILN_ESHAPE, "batch dims do not broadcast");
	bool ints = ir_isint(a->dtype) && ir_isint(b->dtype);
	for (int64_t t = 0, nbat = ir_prod(batch.shape, 0, nb); t < nbat; t++) {
		int64_t ao = ir_boff(&batch, sa, t) * M * K, bo = ir_boff(&batch, sb, t) * K * N;
		for (int64_t i = 0; i < M; i++)
			for (int64_t j = 0; j < N; j++) {
				double acc = 0;
				int64_t acci = 0;
				for (int64_t k = 0; k < K; k++) {
					int64_t ai = ao + i * K + k, bi = bo + k * N + j;
					if (ints)
						acci = addi(acci, muli(ir_load_i64(a, ai), ir_load_i64(b, bi)));
					else
						acc += ir_load(a, ai) * ir_load(b, bi);
				}
				int64_t yi = (t * M + i) * N + j;
				if (ints)
					ir_store_i64(y, yi, acci);
				else
					ir_store(y, yi, acc);
			}
	}
	return KILN_OK;
}

/* Gemm: Y = alpha * A' B' + beta * C, C broadcast to [M, N]. */
static kiln_status gemm(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                        kiln_tensor *const *out)
{
	const kiln_tensor *a = in[0], *b = in[1], *cc = n->nin > 2 ? in[2] : NULL;
	kiln_tensor *y = out[0];
	bool ta = ir_attr_int(n, "transA", 0), tb = ir_attr_int(n, "transB", 0);
	double alpha = ir_attr_float(n, "alpha", 1), beta = ir_attr_float(n, "beta", 1);
	if (a->rank != 2 || b->rank != 2 || y->rank != 2)
		return ir_fail(c, n, KILN_ESHAPE, "Gemm needs 2-D A and B");
	int64_t M = a->shape[ta], K = a->shape[!ta], N = b->shape[!tb];
	int64_t sc[KILN_MAX_RANK];
	if (b->shape[tb] != K || y->shape[0] != M || y->shape[1] != N)
		return ir_fail(c, n, KILN_ESHAPE, "inner dims differ");
	if (cc && !ir_bstrides(cc, y, sc))
		return ir_bcast_fail(c, n, cc, y);
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double acc = 0;
			for (int64_t k = 0; k < K; k++)
				acc += ir_load(a, ta ? k * M + i : i * K + k) *
				       ir_load(b, tb ? j * K + k : k * N + j);
			acc *= alpha;
			if (cc)
				acc += beta * ir_load(cc, ir_boff(y, sc, i * N + j));
			ir_store(y, i * N + j, acc);
		}
	return KILN_OK;
}

/* ---- the table ---------------------------------------------------------- */

const ir_interp_fn ir_interp_table[KILN_OP_COUNT] = {
	[KILN_OP_NEG] = unary, [KILN_OP_ABS] = unary, [KILN_OP_EXP] = unary,
	[KILN_OP_LOG] = unary, [KILN_OP_SQRT] = unary, [KILN_OP_RECIPROCAL] = unary,
	[KILN_OP_FLOOR] = unary, [KILN_OP_CEIL] = unary, [KILN_OP_ROUND] = unary,
	[KILN_OP_SIN] = unary,
	[KILN_OP_COS] = unary, [KILN_OP_RELU] = unary,
	[KILN_OP_ATAN] = unary, [KILN_OP_ASIN] = unary, [KILN_OP_ACOS] = unary, [KILN_OP_SIGMOID] = unary,
	[KILN_OP_TANH] = unary, [KILN_OP_ERF] = unary,
	[KILN_OP_CLIP] = clip,
	[KILN_OP_NOT] = not_op, [KILN_OP_CAST] = cast, [KILN_OP_IDENTITY] = copy,
	[KILN_OP_ADD] = binary, [KILN_OP_SUB] = binary, [KILN_OP_MUL] = binary,
	[KILN_OP_DIV] = binary, [KILN_OP_POW] = binary, [KILN_OP_MAX] = binary,
	[KILN_OP_MIN] = binary, [KILN_OP_EQUAL] = binary, [KILN_OP_LESS] = binary,
	[KILN_OP_GREATER] = binary, [KILN_OP_AND] = binary, [KILN_OP_OR] = binary,
	[KILN_OP_WHERE] = where,
	[KILN_OP_REDUCE_SUM] = reduce, [KILN_OP_REDUCE_MEAN] = reduce,
	[KILN_OP_REDUCE_MAX] = reduce, [KILN_OP_REDUCE_MIN] = reduce, [KILN_OP_ARGMAX] = argmax,
	[KILN_OP_REDUCE_PROD] = reduce,
	[KILN_OP_MATMUL] = matmul, [KILN_OP_GEMM] = gemm,
	[KILN_OP_CONV] = ir_interp_conv, [KILN_OP_CONV_TRANSPOSE] = ir_interp_conv_transpose,
	[KILN_OP_MAX_POOL] = ir_interp_pool, [KILN_OP_AVERAGE_POOL] = ir_interp_pool,
	[KILN_OP_GLOBAL_AVERAGE_POOL] = ir_interp_global_avg_pool,
	[KILN_OP_BATCH_NORM] = ir_interp_batch_norm, [KILN_OP_LAYER_NORM] = ir_interp_layer_norm,
	[KILN_OP_SOFTMAX] = ir_interp_softmax, [KILN_OP_LOG_SOFTMAX] = ir_interp_softmax,
	[KILN_OP_RESHAPE] = copy, [KILN_OP_TRANSPOSE] = transpose, [KILN_OP_CONCAT] = concat,
	[KILN_OP_SPLIT] = split, [KILN_OP_SLICE] = slice, [KILN_OP_GATHER] = gather,
	[KILN_OP_GATHER_ELEMENTS] = gather_elements,
	[KILN_OP_RNN] = ir_interp_rnn, [KILN_OP_GRU] = ir_interp_rnn, [KILN_OP_LSTM] = ir_interp_rnn,
	[KILN_OP_RESIZE] = ir_interp_resize, [KILN_OP_GRID_SAMPLE] = ir_interp_grid_sample,
	[KILN_OP_SCATTER_ELEMENTS] = scatter_elements, [KILN_OP_SCATTER_ND] = scatter_nd,
	[KILN_OP_TOPK] = topk,
	[KILN_OP_FLATTEN] = copy, [KILN_OP_SQUEEZE] = copy, [KILN_OP_UNSQUEEZE] = copy,
	[KILN_OP_EXPAND] = expand, [KILN_OP_PAD] = pad, [KILN_OP_SHAPE] = shape,
	[KILN_OP_CONSTANT] = constant, [KILN_OP_RANGE] = range, [KILN_OP_DROPOUT] = ir_interp_dropout,
	[KILN_OP_SOFTMAX_CE] = ir_interp_loss, [KILN_OP_NLL_LOSS] = ir_interp_loss,
};

ir_interp_fn ir_interp_kernel(kiln_op op)
{
	if (op >= KILN_OP_COUNT)
		return NULL;
	if (ir_interp_table[op])
		return ir_interp_table[op];
	if (ir_interp_quant_table[op])
		return ir_interp_quant_table[op];
	return ir_scalar_table[op] ? formula : NULL;
}

kiln_status ir_interp_node(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out)
{
	if (!ir_interp_kernel(n->op))
		return ir_fail(c, n, KILN_EUNSUPPORTED, "the interpreter has no kernel for this op");
	const ir_op_info *op = ir_op(n->op);
	if (n->nin < op->in_min || n->nout < op->out_min ||
	    (op->in_max != IR_VARIADIC && n->nin > op->in_max) ||
	    (op->out_max != IR_VARIADIC && n->nout > op->out_max))
		return ir_fail(c, n, KILN_EVERIFY, "%u inputs and %u outputs do not fit the op", n->nin,
		               n->nout);
	for (uint32_t k = 0; k < n->nin; k++)
		if (!in[k] && k < op->in_min)
			return ir_fail(c, n, KILN_EVERIFY, "input %u is missing", k);
	for (uint32_t k = 0; k < n->nout; k++)
		if (!out[k])
			return ir_fail(c, n, KILN_EVERIFY, "output %u is missing", k);
	return ir_interp_kernel(n->op)(c, n, in, out);
}

/* ---- kiln_graph_run ----------------------------------------------------- */

/* One run: a tensor per value id (inputs and params borrowed, node results
 * owned), how many reads each value has left, and the symbol bindings. */
typedef struct run {
	const kiln_graph *g;
	kiln_error *err;
	kiln_tensor **t;
	bool *own;
	uint32_t *left;
	int64_t *sym;
} run;

static void drop(run *r, uint32_t id)
{
	if (r->own[id])
		kiln_tensor_free(r->t[id]);
	r->t[id] = NULL;
	r->own[id] = false;
}

/* Binds bare-symbol dims first, then checks every dim (fixed, bound or a
 * composite expression) against the tensor. */
static kiln_status bind_input(run *r, int i, const kiln_tensor *x)
{
	const kiln_graph *g = r->g;
	const ir_value *v = g->val[g->input[i]];
	char want[256], got[256], why[160] = "";
	if (!x)
		return ir_seterr(r->err, KILN_EINVAL, "kiln_graph_run: input %d ('%s') is NULL", i,
		                 v->name ? v->name : "?");
	if (x->dtype != v->type.dtype)
		snprintf(why, sizeof why, "dtype %s, expected %s", kiln_dtype_name(x->dtype),
		         kiln_dtype_name(v->type.dtype));
	else if (x->rank != v->type.rank)
		snprintf(why, sizeof why, "rank %d, expected %d", x->rank, v->type.rank);
	for (int d = 0; d < x->rank && !why[0]; d++) {
		int k = ir_dim_symbol_index(g, v->type.dim[d]);
		if (k >= 0 && r->sym[k] >= 0 && r->sym[k] != x->shape[d])
			snprintf(why, sizeof why, "%s=%lld vs %s=%lld: symbol bound to two sizes",
			         ir_dim_symname(g, k), (long long)r->sym[k], ir_dim_symname(g, k),
			         (long long)x->shape[d]);
		else if (k >= 0 && x->shape[d] > IR_DIM_MAX) /* an empty tensor's other dims */
			snprintf(why, sizeof why, "dim %d is %lld, more than a symbolic dim may be "
			         "(2^48)", d, (long long)x->shape[d]);
		else if (k >= 0)
			r->sym[k] = x->shape[d];
	}
	for (int d = 0; d < x->rank && !why[0]; d++) {
		int64_t want_d = ir_dim_eval(g, v->type.dim[d], r->sym);
		char e[96];
		if (want_d < 0)
			snprintf(why, sizeof why, "dim %d is %s, a symbol no input binds on its own", d,
			         ir_dim_str(g, v->type.dim[d], e, sizeof e));
		else if (want_d != x->shape[d])
			snprintf(why, sizeof why, "dim %d is %lld, expected %lld", d,
			         (long long)x->shape[d], (long long)want_d);
	}
	if (!why[0])
		return KILN_OK;
	return ir_seterr(r->err, KILN_ESHAPE, "kiln_graph_run: input '%s' expects %s, got %s (%s)",
	                 v->name ? v->name : "?", ir_type_str(g, &v->type, want, sizeof want),
	                 ir_tstr(x, got, sizeof got), why);
}

/* Allocates value id with its concrete shape. */
static kiln_status alloc_value(run *r, const ir_node *n, uint32_t id)
{
	const ir_value *v = r->g->val[id];
	int64_t shape[KILN_MAX_RANK];
	char d[160], ty[256];
	for (int k = 0; k < v->type.rank; k++)
		if ((shape[k] = ir_dim_eval(r->g, v->type.dim[k], r->sym)) < 0)
			return ir_seterr(r->err, KILN_EUNSUPPORTED,
			                 "kiln_graph_run: %s: output type %s has a dim the inputs do not bind",
			                 ir_node_desc(n, d, sizeof d), ir_type_str(r->g, &v->type, ty, sizeof ty));
	if (v->type.dtype == KILN_DT_INVALID || v->type.rank < 0)
		return ir_seterr(r->err, KILN_EVERIFY, "kiln_graph_run: %s: output %u has no inferred type",
		                 ir_node_desc(n, d, sizeof d), (unsigned)v->def_out);
	r->t[id] = kiln_tensor_new(v->type.dtype, v->type.rank, shape);
	r->own[id] = true;
	if (!r->t[id])
		return ir_seterr(r->err, KILN_ENOMEM, "kiln_graph_run: %s: cannot allocate %s",
		                 ir_node_desc(n, d, sizeof d), ir_type_str(r->g, &v->type, ty, sizeof ty));
	return KILN_OK;
}

static kiln_status exec(run *r, const ir_node *n, uint64_t seed)
{
	ir_interp c = {r->g, r->err, seed, r->sym};
	kiln_tensor **in = calloc(n->nin + 1, sizeof *in), **out = calloc(n->nout + 1, sizeof *out);
	kiln_status rc = in && out ? KILN_OK : ir_seterr(r->err, KILN_ENOMEM, "out of memory");
	for (uint32_t k = 0; k < n->nin && !rc; k++)
		if ((in[k] = n->in[k] ? r->t[n->in[k]] : NULL) == NULL && n->in[k])
			rc = ir_seterr(r->err, KILN_EVERIFY, "kiln_graph_run: input %u of node %u is not "
			               "computed before it (schedule out of order)", k, n->idx);
	for (uint32_t k = 0; k < n->nout && !rc; k++)
		if (!(rc = alloc_value(r, n, n->out[k])))
			out[k] = r->t[n->out[k]];
	if (!rc)
		rc = ir_interp_node(&c, n, in, out);
	free(in), free(out);
	for (uint32_t k = 0; k < n->nin && !rc; k++)
		if (n->in[k] && --r->left[n->in[k]] == 0)
			drop(r, n->in[k]);
	for (uint32_t k = 0; k < n->nout && !rc; k++)
		if (r->left[n->out[k]] == 0) /* an unused output, e.g. Dropout's mask */
			drop(r, n->out[k]);
	return rc;
}

/* Counts reads per value; graph outputs get one more so they survive. */
static void count_uses(run *r)
{
	const kiln_graph *g = r->g;
	for (uint32_t i = 0; i < g->nnode; i++)
		for (uint32_t k = 0; !g->node[i]->dead && k < g->node[i]->nin; k++)
			r->left[g->node[i]->in[k]]++;
	for (uint32_t i = 0; i < g->noutput; i++)
		r->left[g->output[i]]++;
}

static kiln_status run_graph(run *r, kiln_tensor *const *inputs, kiln_tensor **outputs)
{
	const kiln_graph *g = r->g;
	kiln_status rc = KILN_OK;
	for (int k = 0; k < ir_dim_nsym(g); k++)
		r->sym[k] = -1;
	for (uint32_t i = 0; i < g->ninput && !rc; i++) {
		rc = bind_input(r, (int)i, inputs[i]);
		r->t[g->input[i]] = inputs[i];
	}
	for (uint32_t id = 1; id < g->nval; id++)
		if (g->val[id]->kind == IR_V_PARAM)
			r->t[id] = g->val[id]->data;
	count_uses(r);
	for (uint32_t i = 0; i < g->nnode && !rc; i++)
		if (!g->node[i]->dead)
			rc = exec(r, g->node[i], 0);
	for (uint32_t i = 0; i < g->noutput && !rc; i++) {
		const kiln_tensor *t = r->t[g->output[i]];
		if (!t)
			rc = ir_seterr(r->err, KILN_EVERIFY, "kiln_graph_run: output %u is never computed", i);
		else if (!(outputs[i] = kiln_tensor_clone(t)))
			rc = ir_seterr(r->err, KILN_ENOMEM, "kiln_graph_run: out of memory");
	}
	for (uint32_t i = 0; i < g->noutput && rc; i++) {
		kiln_tensor_free(outputs[i]);
		outputs[i] = NULL;
	}
	return rc;
}

KILN_API kiln_status kiln_graph_run(const kiln_graph *g, kiln_tensor *const *inputs,
                                    int ninputs, kiln_tensor **outputs, int noutputs,
                                    kiln_error *err)
{
	if (!g || (ninputs > 0 && !inputs) || (noutputs > 0 && !outputs))
		return ir_seterr(err, KILN_EINVAL, "kiln_graph_run: null argument");
	for (int i = 0; i < noutputs; i++)
		outputs[i] = NULL;
	if (g->status != KILN_OK)
		return ir_seterr(err, g->status, "kiln_graph_run: graph '%s' has an error: %s", g->name,
		                 g->errmsg);
	if (ir_check_weights(g, "run", err) != KILN_OK)
		return KILN_EINVAL;
	if (ninputs != (int)g->ninput || noutputs != (int)g->noutput)
		return ir_seterr(err, KILN_EINVAL,
		                 "kiln_graph_run: graph '%s' has %u inputs and %u outputs, got %d and %d",
		                 g->name, g->ninput, g->noutput, ninputs, noutputs);
	run r = {g, err, calloc(g->nval + 1, sizeof *r.t), calloc(g->nval + 1, sizeof *r.own),
	         calloc(g->nval + 1, sizeof *r.left), calloc(ir_dim_nsym(g) + 1, sizeof *r.sym)};
	kiln_status rc = r.t && r.own && r.left && r.sym
	                         ? run_graph(&r, inputs, outputs)
	                         : ir_seterr(err, KILN_ENOMEM, "kiln_graph_run: out of memory");
	for (uint32_t id = 0; r.t && r.own && id < g->nval; id++)
		if (r.own[id])
			kiln_tensor_free(r.t[id]);
	free(r.t), free(r.own), free(r.left), free(r.sym);
	return rc;
}
