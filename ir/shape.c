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
 *
 * This file holds the shared checks, broadcasting, the element-wise,
 * reduction and movement rules, the table and the driver; the rules for
 * matmul/gemm, convolution and pooling geometry, normalisation, dropout and
 * the losses live in shape_nn.c, and ir/shape.h declares what the two share.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/shape.h"

static bool is_int(kiln_dtype dt)
{
	return dt == KILN_I8 || dt == KILN_U8 || dt == KILN_I32 || dt == KILN_I64;
}

const char *ir_ints_str(const int64_t *v, uint32_t cnt, char *buf, size_t size)
{
	size_t k = snprintf(buf, size, "[");
	for (uint32_t i = 0; i < cnt && k < size; i++)
		k += snprintf(buf + k, size - k, "%s%lld", i ? "," : "", (long long)v[i]);
	if (k < size)
		snprintf(buf + k, size - k, "]");
	return buf;
}

/* Ints attribute name of n as "[3,N,N]": symbolic dims by their names. */
static const char *attr_str(const kiln_graph *g, const ir_node *n, const char *name, char *buf,
                            size_t size)
{
	const ir_attr *a = ir_attr_get(n, name);
	size_t k = snprintf(buf, size, "[");
	char d[96];
	for (uint32_t i = 0; a && a->kind == IR_A_INTS && i < a->n && k < size; i++)
		k += snprintf(buf + k, size - k, "%s%s", i ? "," : "",
		              ir_attr_is_dim(a, i) ? ir_dim_str(g, a->u.ints[i], d, sizeof d)
		                                   : (snprintf(d, sizeof d, "%lld",
		                                               (long long)a->u.ints[i]), d));
	if (k < size)
		snprintf(buf + k, size - k, "]");
	return buf;
}

/* Normalises axis against rank (ONNX: [-rank, rank-1], or [-rank, rank]
 * when extra is 1, as for Flatten and Unsqueeze). */
kiln_status ir_axis_norm(kiln_graph *g, const ir_node *n, int64_t axis, int rank,
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
		int a = 0;
		TRY(ir_axis_norm(g, n, ax[i], rank, 0, t, &a));
		if (mask[a]) {
			tbuf b;
			FAIL(KILN_ESHAPE, "axis %lld repeated for %s", (long long)ax[i], TS(t, b));
		}
		mask[a] = true;
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

/* ir_dim_mul with an overflow check on the concrete part. */
kiln_status ir_dim_mul_checked(kiln_graph *g, const ir_node *n, int64_t a, int64_t b,
                               int64_t *out)
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
	int axis = 0;
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", 0), in[0].rank, 0, &in[0], &axis));
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
	uint64_t dims;
	uint32_t ns = ir_attr_dims(n, "shape", &s, &dims);
	bool allowzero = ir_attr_int(n, "allowzero", 0) != 0;
	char b[128];
	if (!ir_attr_get(n, "shape") || ns > KILN_MAX_RANK)
		FAIL(KILN_EINVAL, "shape must be given with at most %d dims", KILN_MAX_RANK);
	*t = (ir_type){x->dtype, (int)ns, {0}};
	*infer = -1;
	for (uint32_t i = 0; i < ns; i++) {
		if (dims >> i & 1) { /* a symbolic dim: [N,S,384] from [N*S,384] */
			t->dim[i] = s[i];
		} else if (s[i] == 0 && !allowzero) {
			tbuf a;
			if (i >= (uint32_t)x->rank)
				FAIL(KILN_ESHAPE, "shape %s copies dim %u, which %s lacks",
				     attr_str(g, n, "shape", b, sizeof b), i, TS(x, a));
			t->dim[i] = x->dim[i];
		} else if (s[i] == -1 && *infer < 0) {
			*infer = (int)i;
		} else if (s[i] < 0) {
			FAIL(KILN_ESHAPE, "bad target shape %s (one -1 at most, no other negatives)",
			     attr_str(g, n, "shape", b, sizeof b));
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
	int infer = -1;
	TRY(reshape_dims(g, n, &in[0], &t, &infer));
	prod pi = {1, 0, {0}, false}, po = {1, 0, {0}, false};
	for (int i = 0; i < in[0].rank; i++)
		prod_add(g, &pi, in[0].dim[i]);
	for (int i = 0; i < t.rank; i++)
		if (i != infer)
			prod_add(g, &po, t.dim[i]);
	tbuf a;
	char b[128];
	if (pi.overflow || po.overflow)
		FAIL(KILN_ESHAPE, "element count of %s or %s overflows", TS(&in[0], a),
		     attr_str(g, n, "shape", b, sizeof b));
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
			     "not cancel", attr_str(g, n, "shape", b, sizeof b), TS(&in[0], a));
		FAIL(KILN_ESHAPE, "cannot reshape %s to %s: element count differs",
		     TS(&in[0], a), attr_str(g, n, "shape", b, sizeof b));
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
		     ir_ints_str(p, np, b, sizeof b), TS(&in[0], a));
	}
	out[0] = t;
	return KILN_OK;
}

static kiln_status shape_concat(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out)
{
	int axis = 0;
	if (!ir_attr_get(n, "axis"))
		FAIL(KILN_EINVAL, "axis is required");
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", 0), in[0].rank, 0, &in[0], &axis));
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
	int axis = 0;
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", 0), x->rank, 0, x, &axis));
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
			FAIL(KILN_ESHAPE, "bad split sizes %s", ir_ints_str(sz, cnt, b, sizeof b));
	}
	if (cnt && sum != d)
		FAIL(KILN_ESHAPE, "split sizes %s do not add up to axis %d of %s",
		     ir_ints_str(sz, cnt, b, sizeof b), axis, TS(x, a));
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

/* An axis whose start or end is a symbolic dim (Slice's attributes may hold
 * them: position_ids[:, :S] of a [1,512] buffer): [0:E:1] is E long, E
 * being that dim, when E fits in the axis.  Where that is not known (a
 * fixed axis, or another symbol) the result is still E, and the
 * interpreter and the generated code check E <= dim at run time
 * instead of clamping as ONNX would, so a too long E
 * fails with a message instead of giving a shape the graph did not say. */
static kiln_status slice_sym(kiln_graph *g, const ir_node *n, const ir_type *x, int axis,
                             int64_t start, bool ssym, int64_t end, bool esym, int64_t step,
                             int64_t *out)
{
	char a[256], b[96], e[96];
	if (ssym || start != 0 || !esym || step != 1) {
		if (ssym)
			ir_dim_str(g, start, b, sizeof b);
		else
			snprintf(b, sizeof b, "%lld", (long long)start);
		if (esym)
			ir_dim_str(g, end, e, sizeof e);
		else
			snprintf(e, sizeof e, "%lld", (long long)end);
		FAIL(KILN_EUNSUPPORTED, "slice [%s:%s:%lld] of axis %d of %s: with a symbolic start "
		     "or end kiln takes only [0:end:1], the end a dim", b, e, (long long)step, axis,
		     TS(x, a));
	}
	*out = end;
	return KILN_OK;
}

static kiln_status shape_slice(kiln_graph *g, const ir_node *n, const ir_type *in,
                               ir_type *out)
{
	const ir_type *x = &in[0];
	const int64_t *st, *en, *ax, *sp;
	uint64_t sd, ed;
	uint32_t ns = ir_attr_dims(n, "starts", &st, &sd), ne = ir_attr_dims(n, "ends", &en, &ed);
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
		if ((sd | ed) >> i & 1) {
			TRY(slice_sym(g, n, x, axis, st[i], sd >> i & 1, en[i], ed >> i & 1, step,
			              &t.dim[axis]));
			continue;
		}
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
	int axis = 0;
	tbuf a, b;
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", 0), x->rank, 0, x, &axis));
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

/* GatherElements: the indices' shape, x's dtype; same ranks, and off the
 * axis the indices no larger than x where both are known. */
static kiln_status shape_gather_elements(kiln_graph *g, const ir_node *n, const ir_type *in,
                                         ir_type *out)
{
	const ir_type *x = &in[0], *ix = &in[1];
	int axis = 0;
	tbuf a, b;
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", 0), x->rank, 0, x, &axis));
	if (ix->dtype != KILN_I32 && ix->dtype != KILN_I64)
		FAIL(KILN_ESHAPE, "indices must be i32 or i64, got %s", TS(ix, a));
	if (ix->rank != x->rank)
		FAIL(KILN_ESHAPE, "indices %s and data %s must have the same rank", TS(ix, a), TS(x, b));
	for (int d = 0; d < x->rank; d++)
		if (d != axis && !ir_dim_expr(g, x->dim[d]) && !ir_dim_expr(g, ix->dim[d]) &&
		    ix->dim[d] > x->dim[d])
			FAIL(KILN_ESHAPE, "indices %s exceed data %s on dim %d", TS(ix, a), TS(x, b), d);
	out[0] = *ix;
	out[0].dtype = x->dtype;
	return KILN_OK;
}

/* TopK: the k largest (smallest) along axis, and their i64 indices. */
static kiln_status shape_topk(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *x = &in[0];
	int axis = 0;
	tbuf a;
	int64_t k = ir_attr_int(n, "k", -1);
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", -1), x->rank, 0, x, &axis));
	if (x->dim[axis] < 0)
		FAIL(KILN_EUNSUPPORTED, "TopK along symbolic dim %d of %s", axis, TS(x, a));
	if (k < 0 || k > x->dim[axis])
		FAIL(KILN_ESHAPE, "k = %lld for dim %d of %s", (long long)k, axis, TS(x, a));
	out[0] = *x;
	out[0].dim[axis] = k;
	out[1] = out[0];
	out[1].dtype = KILN_I64;
	return KILN_OK;
}

/* 0 none, 1 add, 2 mul; -1 otherwise. */
static int scatter_reduction(const ir_node *n)
{
	const char *r = ir_attr_str(n, "reduction", "none");
	return !strcmp(r, "none") ? 0 : !strcmp(r, "add") ? 1 : !strcmp(r, "mul") ? 2 : -1;
}

/* ScatterElements: data's type; indices and updates of one shape, data's
 * rank. */
static kiln_status shape_scatter_elements(kiln_graph *g, const ir_node *n, const ir_type *in,
                                          ir_type *out)
{
	const ir_type *x = &in[0], *ix = &in[1], *u = &in[2];
	int axis = 0;
	tbuf a, b;
	TRY(ir_axis_norm(g, n, ir_attr_int(n, "axis", 0), x->rank, 0, x, &axis));
	if (scatter_reduction(n) < 0)
		FAIL(KILN_EINVAL, "reduction must be none, add or mul, got \"%s\"",
		     ir_attr_str(n, "reduction", ""));
	if (ix->dtype != KILN_I32 && ix->dtype != KILN_I64)
		FAIL(KILN_ESHAPE, "indices must be i32 or i64, got %s", TS(ix, a));
	if (ix->rank != u->rank)
		FAIL(KILN_ESHAPE, "indices %s and updates %s must have one shape", TS(ix, a), TS(u, b));
	for (int d = 0; d < ix->rank; d++)
		if (ix->dim[d] != u->dim[d])
			FAIL(KILN_ESHAPE, "indices %s and updates %s must have one shape", TS(ix, a), TS(u, b));
	if (ix->rank != x->rank || u->dtype != x->dtype)
		FAIL(KILN_ESHAPE, "updates %s must have data %s's rank and dtype", TS(u, a), TS(x, b));
	out[0] = *x;
	return KILN_OK;
}

/* ScatterND: data's type; indices [..., k] with k <= rank, updates
 * indices.shape[:-1] + data.shape[k:]. */
static kiln_status shape_scatter_nd(kiln_graph *g, const ir_node *n, const ir_type *in,
                                    ir_type *out)
{
	const ir_type *x = &in[0], *ix = &in[1], *u = &in[2];
	tbuf a, b, c;
	if (scatter_reduction(n) < 0)
		FAIL(KILN_EINVAL, "reduction must be none, add or mul, got \"%s\"",
		     ir_attr_str(n, "reduction", ""));
	if ((ix->dtype != KILN_I32 && ix->dtype != KILN_I64) || ix->rank < 1 || u->dtype != x->dtype)
		FAIL(KILN_ESHAPE, "indices %s must be integers of rank >= 1 and updates %s data %s's "
		     "dtype", TS(ix, a), TS(u, b), TS(x, c));
	int64_t k = ix->dim[ix->rank - 1];
	bool fits = k >= 1 && k <= x->rank && u->rank == ix->rank - 1 + x->rank - k;
	for (int d = 0; fits && d < ix->rank - 1; d++)
		fits = u->dim[d] == ix->dim[d];
	for (int d = 0; fits && d < x->rank - k; d++)
		fits = u->dim[ix->rank - 1 + d] == x->dim[k + d];
	if (!fits)
		FAIL(KILN_ESHAPE, "updates %s do not fit indices %s into data %s (the index length "
		     "must be a number)", TS(u, a), TS(ix, b), TS(x, c));
	out[0] = *x;
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
		TRY(ir_dim_mul_checked(g, n, *p, in[0].dim[i], p));
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
			FAIL(KILN_ESHAPE, "bad expand shape %s", ir_ints_str(s, ns, b, sizeof b));
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
		     ir_ints_str(p, np, b, sizeof b), TS(x, a));
	ir_type t = *x;
	for (int i = 0; i < x->rank; i++) {
		int64_t d = x->dim[i], extra, sum;
		if (__builtin_add_overflow(p[i], p[i + x->rank], &extra) ||
		    (d >= 0 && __builtin_add_overflow(d, extra, &sum)) || extra > IR_DIM_MAX)
			FAIL(KILN_ESHAPE, "pads %s overflow axis %d of %s",
			     ir_ints_str(p, np, b, sizeof b), i, TS(x, a));
		if (d >= 0 && d + extra < 0)
			FAIL(KILN_ESHAPE, "pads %s crop axis %d of %s below zero",
			     ir_ints_str(p, np, b, sizeof b), i, TS(x, a));
		if (d < 0 && extra < 0)
			FAIL(KILN_EUNSUPPORTED, "pads %s crop symbolic axis %d of %s",
			     ir_ints_str(p, np, b, sizeof b), i, TS(x, a));
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

/* Range: [n[0]] of dtype, n[0] a size or a symbolic dim. */
static kiln_status shape_range(kiln_graph *g, const ir_node *n, const ir_type *in,
                               ir_type *out)
{
	const int64_t *v;
	uint64_t dims;
	int64_t dt = ir_attr_int(n, "dtype", KILN_DT_INVALID);
	(void)in;
	if (ir_attr_dims(n, "n", &v, &dims) != 1 || (!dims && (v[0] < 0 || v[0] > IR_DIM_MAX)))
		FAIL(KILN_EINVAL, "n must be one size (0 to 2^48) or symbolic dim");
	if (dt <= KILN_DT_INVALID || dt >= KILN_DT_COUNT || dt == KILN_BOOL)
		FAIL(KILN_EINVAL, "dtype must be a numeric dtype");
	out[0] = (ir_type){(kiln_dtype)dt, 1, {v[0]}};
	return KILN_OK;
}

/* ---- the table and the driver ---------------------------------------- */

const ir_shape_fn ir_shape_table[KILN_OP_COUNT] = {
	[KILN_OP_NEG] = shape_same, [KILN_OP_ABS] = shape_same, [KILN_OP_EXP] = shape_same,
	[KILN_OP_LOG] = shape_same, [KILN_OP_SQRT] = shape_same,
	[KILN_OP_RECIPROCAL] = shape_same, [KILN_OP_FLOOR] = shape_same,
	[KILN_OP_CEIL] = shape_same, [KILN_OP_ROUND] = shape_same, [KILN_OP_SIN] = shape_same, [KILN_OP_COS] = shape_same,
	[KILN_OP_ATAN] = shape_same, [KILN_OP_ASIN] = shape_same, [KILN_OP_ACOS] = shape_same,
	[KILN_OP_RELU] = shape_same,
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
	[KILN_OP_REDUCE_PROD] = shape_reduce,
	[KILN_OP_ARGMAX] = shape_argmax,

	[KILN_OP_MATMUL] = ir_shape_matmul, [KILN_OP_GEMM] = ir_shape_gemm,

	[KILN_OP_CONV] = ir_shape_conv, [KILN_OP_CONV_TRANSPOSE] = ir_shape_conv_transpose,
	[KILN_OP_MAX_POOL] = ir_shape_pool, [KILN_OP_AVERAGE_POOL] = ir_shape_pool,
	[KILN_OP_GLOBAL_AVERAGE_POOL] = ir_shape_global_pool,

	[KILN_OP_BATCH_NORM] = ir_shape_batch_norm, [KILN_OP_LAYER_NORM] = ir_shape_layer_norm,
	[KILN_OP_SOFTMAX] = ir_shape_softmax, [KILN_OP_LOG_SOFTMAX] = ir_shape_softmax,

	[KILN_OP_RESHAPE] = shape_reshape, [KILN_OP_TRANSPOSE] = shape_transpose,
	[KILN_OP_CONCAT] = shape_concat, [KILN_OP_SPLIT] = shape_split,
	[KILN_OP_SLICE] = shape_slice, [KILN_OP_GATHER] = shape_gather,
	[KILN_OP_GATHER_ELEMENTS] = shape_gather_elements,
	[KILN_OP_RNN] = ir_shape_rnn, [KILN_OP_GRU] = ir_shape_rnn, [KILN_OP_LSTM] = ir_shape_rnn,
	[KILN_OP_RESIZE] = ir_shape_resize, [KILN_OP_GRID_SAMPLE] = ir_shape_grid_sample, [KILN_OP_TOPK] = shape_topk,
	[KILN_OP_SCATTER_ELEMENTS] = shape_scatter_elements, [KILN_OP_SCATTER_ND] = shape_scatter_nd,
	[KILN_OP_FLATTEN] = shape_flatten, [KILN_OP_SQUEEZE] = shape_squeeze,
	[KILN_OP_UNSQUEEZE] = shape_unsqueeze, [KILN_OP_EXPAND] = shape_expand,
	[KILN_OP_PAD] = shape_pad, [KILN_OP_SHAPE] = shape_shape,
	[KILN_OP_CONSTANT] = shape_constant,
	[KILN_OP_RANGE] = shape_range,

	[KILN_OP_DROPOUT] = ir_shape_dropout,
	[KILN_OP_SOFTMAX_CE] = ir_shape_loss, [KILN_OP_NLL_LOSS] = ir_shape_loss,
};

/* An op without an entry takes its rule from its flags: IR_ELEM with
 * IR_BCAST broadcasts its inputs, IR_ELEM alone keeps its input's type. */
ir_shape_fn ir_shape_rule(kiln_op op)
{
	if (op >= KILN_OP_COUNT)
		return NULL;
	if (ir_shape_table[op])
		return ir_shape_table[op];
	if (ir_shape_quant_table[op])
		return ir_shape_quant_table[op];
	uint32_t f = ir_op(op)->flags;
	return !(f & IR_ELEM) ? NULL : f & IR_BCAST ? shape_bcast : shape_same;
}

/* Ops whose first input is not governed by the flag rule below: Where's is
 * the bool condition, Cast and Shape take any dtype. */
static const bool any_first_dtype[KILN_OP_COUNT] = {
	[KILN_OP_WHERE] = true, [KILN_OP_CAST] = true, [KILN_OP_SHAPE] = true,
	/* the quantization rules check their own (shape_quant.c) */
	[KILN_OP_QUANTIZE_LINEAR] = true, [KILN_OP_DEQUANTIZE_LINEAR] = true,
	[KILN_OP_MATMUL_INTEGER] = true, [KILN_OP_CONV_INTEGER] = true,
	[KILN_OP_QLINEAR_MATMUL] = true, [KILN_OP_QLINEAR_CONV] = true,
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
	ir_shape_fn rule = ir_shape_rule(n->op);
	if (!rule)
		FAIL(KILN_EUNSUPPORTED, "no shape rule for this op");
	return rule(g, n, in, out);
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
