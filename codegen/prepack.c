/*
 * prepack.c: cg_prepack, constant B operands of f32 GEMMs packed at
 * compile time.
 *
 * A Linear layer's weight is the B of its GEMM (bnfold stores it [K, N]),
 * constant in an inference library.  kiln_sgemm packs a B in column panels
 * on every call (the packed path) or reads it in place (the direct forms,
 * for few rows of A), where a strip of columns is K rows N floats apart: a
 * new page every row or two, which no hardware prefetcher follows and the
 * TLB misses.  ONNX Runtime packs such weights once, at load.  Here they
 * are packed once, at compile time, in the panels the LLVM backend's
 * GEMM reads (cg_panels.b: 16 columns, each CG_PANEL_ROWS(K) rows of 16
 * floats, zero past N and K), and the GEMM reads them instead of the
 * weight (cg_gemm.b_panel; kiln_sgemm_pb).  A GEMM of a fixed M of more
 * than CG_WIDE_MIN_M rows (a transformer's Linear layers at a fixed batch
 * and sequence), which takes the blocked path, gets panels as wide as its
 * micro-kernel (cg_panels.b_wide, kiln_sgemm_pbw), read in place: the
 * blocked path otherwise copies every panel of B on every call (10% of a
 * BERT layer's time at 128 tokens).  The weight, if no kernel reads it any
 * more, keeps no bytes in the library: it becomes an empty scratch buffer.
 *
 * A GEMM qualifies when it is a plain f32 GEMM whose B is a constant
 * buffer read row-major as one matrix (b_cs 1, b_rs N, the same for every
 * batch) with N and K fixed and N at least a vector (MIN_N).  Two GEMMs
 * on the same weight at the same offset share one packed copy.
 *
 * A conv's weights are its GEMM's constant A instead (M output channels, K
 * their taps): kiln_sgemm packs them on every call, and at a batch on
 * every image (packa: 174 us of a 1654 us GEMM, M = 256, K = 2304,
 * N = 196).  Such an A (rows contiguous and K apart, M and K fixed, at
 * least MIN_M_A rows) is packed here in the micro-kernel's MR-row panels,
 * alpha folded in (cg_gemm.a_panel; kiln_sgemm_pa), or, where the
 * target has a GEMM with A's rows in its lanes (cg_panels.a_lanes,
 * kiln_sgemm_pm) and the product suits it (B's rows contiguous, C narrow:
 * a conv on a small map; K deep enough to pay for its transposes), in
 * that GEMM's taller panels.  A GEMM packs one operand, B first.
 *
 * KILN_PREPACK=0 (read by the driver) turns it off.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

/* MIN_M_A: an A of fewer rows is not packed: kiln_sgemm takes such GEMMs
 * with its 8-row tiles, which do not fit MR-row panels (the bench CNN's
 * 8- and 16-channel convs at batch 16 took 12% more time packed).  With
 * B or C in channel blocks one panel of a_lanes rows is enough: only
 * kiln_sgemm_pm reads or writes those (MobileNetV2's 144 -> 32 project
 * conv at 28x28 reading its depthwise conv's blocks: the conv 0.067 ->
 * 0.041 ms without the transpose into planes, the GEMM 0.048 -> 0.051). */
enum { MIN_N = 16, MIN_M_A = 33, MAX_SEEN = 4096 };

static bool const_int(const cg_expr *e, int64_t *v)
{
	if (!e || e->kind != CG_CONST)
		return false;
	*v = e->i;
	return true;
}

typedef struct seen {
	int b;
	int64_t off;
	int P;                 /* B: the panel width */
	double alpha;          /* A: folded in */
	bool a;                /* packed as an A (row panels) */
	int packed;
} seen;

typedef struct ctx {
	cg_module *m;
	int P;                 /* B's panel width (0: B is not packed) */
	int PW;                /* ... for a GEMM of more than CG_WIDE_MIN_M rows (0: P) */
	int PA;                /* A's panel height (0: A is not packed) */
	cg_panels pn;          /* ... or a_lanes where it fits (cg_prepack_lanes_fit) */
	seen s[MAX_SEEN];
	int n;
	kiln_status st;
	bool *read;            /* per buffer: still read by a kernel (after packing) */
} ctx;

/* The packed copy of g's B (a new constant buffer, or one made for an
 * earlier GEMM), or -1 when g does not qualify; ENOMEM in c->st. */
static int packed_b(ctx *c, const cg_gemm *g, int64_t *koff, int *pw)
{
	cg_module *m = c->m;
	int64_t N, K, M, off = 0, rs, cs, bs = 0, batch = 1, P = c->P;
	if (!P || !cg_gemm_is_f32(g) || g->has_b_rows || g->b_block || g->c_block || g->a_panel ||
	    g->b_panel || g->b < 0 || g->b >= m->nbuf)
		return -1;
	const cg_buf *b = &m->buf[g->b];
	if (b->kind != CG_BUF_CONST || b->alias >= 0 || !b->data || b->data->dtype != KILN_F32 ||
	    b->dt != KILN_F32)
		return -1;
	if (!const_int(g->N, &N) || !const_int(g->K, &K) || !const_int(g->b_rs, &rs) ||
	    !const_int(g->b_cs, &cs) || (g->b_off && !const_int(g->b_off, &off)) ||
	    (g->b_bs && !const_int(g->b_bs, &bs)) || (g->batch && !const_int(g->batch, &batch)))
		return -1;
	if (N < MIN_N || K < 1 || cs != 1 || rs != N || off < 0 || (bs != 0 && batch != 1))
		return -1;
	if (c->PW > 0 && const_int(g->M, &M) && M > CG_WIDE_MIN_M && N > 2 * c->PW)
		P = c->PW;
	int64_t numel = kiln_tensor_numel(b->data);
	if (K > (numel - off) / N) /* rows [0, K) of N from off must lie inside the tensor */
		return -1;
	*koff = off;
	for (int i = 0; i < c->n; i++)
		if (!c->s[i].a && c->s[i].b == g->b && c->s[i].off == off && c->s[i].P == P) {
			*pw = (int)P;
			return c->s[i].packed;
		}
	int64_t np = (N + P - 1) / P, KP = CG_PANEL_ROWS(K);
	const float *src = (const float *)b->data->data + off;
	kiln_tensor *t = ir_alloc(m->arena, sizeof *t);
	float *d = ir_alloc(m->arena, (size_t)(np * KP * P) * sizeof *d);
	if (!t || !d) {
		c->st = KILN_ENOMEM;
		return -1;
	}
	for (int64_t p = 0; p < np; p++) {
		int64_t n0 = p * P, w = N - n0 < P ? N - n0 : P;
		float *dp = d + p * KP * P;
		for (int64_t k = 0; k < K; k++) {
			memcpy(dp + k * P, src + k * N + n0, (size_t)w * sizeof *d);
			memset(dp + k * P + w, 0, (size_t)(P - w) * sizeof *d);
		}
		memset(dp + K * P, 0, (size_t)((KP - K) * P) * sizeof *d);
	}
	*t = (kiln_tensor){.dtype = KILN_F32, .rank = 3, .shape = {np, KP, P}, .data = d};
	int pb = cg_buf_new(m, CG_BUF_CONST, KILN_F32, cg_const(m, KILN_I64, (double)(np * KP * P)));
	if (pb < 0) {
		c->st = KILN_ENOMEM;
		return -1;
	}
	cg_buf *cb = &m->buf[pb]; /* cg_buf_new may have moved m->buf */
	cb->data = t;
	cb->type.rank = 3;
	cb->type.dim[0] = np, cb->type.dim[1] = KP, cb->type.dim[2] = P;
	const char *wn = m->buf[g->b].name;
	size_t len = (wn ? strlen(wn) : 1) + 8;
	char *name = ir_alloc(m->arena, len);
	if (name)
		snprintf(name, len, "%s.packed", wn ? wn : "w");
	cb->name = name;
	if (c->n < MAX_SEEN) /* past it packed all the same, only not shared */
		c->s[c->n++] = (seen){.b = g->b, .off = off, .P = (int)P, .packed = pb};
	*pw = (int)P;
	return pb;
}

bool cg_prepack_lanes_fit(const cg_panels *pn, int64_t M, int64_t N, int64_t K, bool blocked)
{
	/* the rows it computes in vain: past M in its last vector of rows
	 * when two panels or more come before it (a last panel of one vector
	 * runs a micro-kernel of one: M = 80, 112, 144), else in its last
	 * panel.  kiln_sgemm_pm against kiln_sgemm_pa (a harness, one thread,
	 * weights from L3, us): 80x196x480 113 -> 101, 112x196x672 211 ->
	 * 193, 80x49x480 30.8 -> 28.5, 112x49x832 70.6 -> 67.1; but M = 48
	 * (one panel and a half) 48x49x832 29.2 -> 31.8. */
	int64_t P = pn->a_lanes, V = pn->c_block && M >= 2 * P ? pn->c_block : P;
	if (blocked && !pn->c_block)
		return false;
	return pn->a > 0 && P > 0 && M >= (blocked ? P : MIN_M_A) && K >= 1 &&
	       N <= (blocked ? pn->c_block_max_n : pn->a_lanes_max_n) &&
	       (blocked || K >= pn->a_lanes_min_k) &&
	       ((M + V - 1) / V * V - M) * 8 <= M;
}

/* The packed copy of g's A (row panels of c->PA, or of a_lanes where that
 * fits, alpha folded in; *pp the height), or -1 when g does not qualify;
 * ENOMEM in c->st. */
static int packed_a(ctx *c, const cg_gemm *g, int *pp)
{
	cg_module *m = c->m;
	int64_t M, K, off = 0, rs, cs, bs = 0, batch = 1, P = c->PA, N, bcs;
	if (!P || !cg_gemm_is_f32(g) || g->has_b_rows || g->a_panel || g->b_panel || g->a < 0 ||
	    g->a >= m->nbuf)
		return -1;
	const cg_buf *a = &m->buf[g->a];
	if (a->kind != CG_BUF_CONST || a->alias >= 0 || !a->data || a->data->dtype != KILN_F32 ||
	    a->dt != KILN_F32)
		return -1;
	if (!const_int(g->M, &M) || !const_int(g->K, &K) || !const_int(g->a_rs, &rs) ||
	    !const_int(g->a_cs, &cs) || (g->a_off && !const_int(g->a_off, &off)) ||
	    (g->a_bs && !const_int(g->a_bs, &bs)) || (g->batch && !const_int(g->batch, &batch)))
		return -1;
	bool blocked = g->c_block > 0 || g->b_block > 0;
	if (M < (blocked ? c->pn.a_lanes : MIN_M_A) || K < 1 || cs != 1 || rs != K || off < 0 ||
	    (bs != 0 && batch != 1))
		return -1;
	if (M > (kiln_tensor_numel(a->data) - off) / K)
		return -1;
	/* the lanes-along-rows panels: B's rows contiguous, C narrow, K deep,
	 * and at most an eighth of the last panel's rows padding */
	if (const_int(g->N, &N) && const_int(g->b_cs, &bcs) && bcs == 1 &&
	    cg_prepack_lanes_fit(&c->pn, M, N, K, g->c_block > 0 || g->b_block > 0))
		P = c->pn.a_lanes;
	*pp = (int)P;
	for (int i = 0; i < c->n; i++)
		if (c->s[i].a && c->s[i].b == g->a && c->s[i].off == off && c->s[i].alpha == g->alpha &&
		    c->s[i].P == P)
			return c->s[i].packed;
	int64_t np = (M + P - 1) / P;
	const float *src = (const float *)a->data->data + off;
	kiln_tensor *t = ir_alloc(m->arena, sizeof *t);
	float *d = ir_alloc(m->arena, (size_t)(np * K * P) * sizeof *d);
	if (!t || !d) {
		c->st = KILN_ENOMEM;
		return -1;
	}
	float alpha = (float)g->alpha; /* as packa multiplies: alpha * A in f32 */
	for (int64_t p = 0; p < np; p++)
		for (int64_t k = 0; k < K; k++)
			for (int64_t i = 0; i < P; i++) {
				int64_t r = p * P + i;
				d[(p * K + k) * P + i] = r < M ? src[r * K + k] * alpha : 0.0f;
			}
	*t = (kiln_tensor){.dtype = KILN_F32, .rank = 3, .shape = {np, K, P}, .data = d};
	int pa = cg_buf_new(m, CG_BUF_CONST, KILN_F32, cg_const(m, KILN_I64, (double)(np * K * P)));
	if (pa < 0) {
		c->st = KILN_ENOMEM;
		return -1;
	}
	cg_buf *cb = &m->buf[pa]; /* cg_buf_new may have moved m->buf */
	cb->data = t;
	cb->type.rank = 3;
	cb->type.dim[0] = np, cb->type.dim[1] = K, cb->type.dim[2] = P;
	const char *wn = m->buf[g->a].name;
	size_t len = (wn ? strlen(wn) : 1) + 8;
	char *name = ir_alloc(m->arena, len);
	if (name)
		snprintf(name, len, "%s.packed", wn ? wn : "w");
	cb->name = name;
	if (c->n < MAX_SEEN)
		c->s[c->n++] = (seen){.b = g->a, .off = off, .P = (int)P, .alpha = g->alpha,
		                      .a = true, .packed = pa};
	return pa;
}

static void walk(ctx *c, cg_stmt *s)
{
	if (!s || c->st != KILN_OK)
		return;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			walk(c, s->items[i]);
		break;
	case CG_FOR:
		walk(c, s->body);
		break;
	case CG_IF:
		walk(c, s->then_s);
		walk(c, s->else_s);
		break;
	case CG_GEMM: {
		cg_gemm *g = s->gemm;
		int64_t off;
		int P = 0, pb = packed_b(c, g, &off, &P);
		if (pb >= 0) {
			g->b = pb;
			g->b_off = cg_const(c->m, KILN_I64, 0);
			g->b_bs = cg_const(c->m, KILN_I64, 0);
			g->b_rs = cg_const(c->m, KILN_I64, P);
			g->b_panel = P;
			if (!g->b_off || !g->b_bs || !g->b_rs)
				c->st = KILN_ENOMEM;
			break;
		}
		int PA = 0, pa = c->st == KILN_OK ? packed_a(c, g, &PA) : -1;
		if (pa >= 0) {
			g->a = pa;
			g->a_off = cg_const(c->m, KILN_I64, 0);
			g->a_bs = cg_const(c->m, KILN_I64, 0);
			g->a_rs = cg_const(c->m, KILN_I64, PA);
			g->alpha = 1; /* folded in */
			g->a_panel = PA;
			if (!g->a_off || !g->a_bs || !g->a_rs)
				c->st = KILN_ENOMEM;
		}
		break;
	}
	default:
		break;
	}
}

static void mark_read(void *ctx, int buf, bool write)
{
	(void)write;
	bool *read = ctx;
	read[buf] = true;
}

/* a weight that nothing reads (any more: packed or split; or never: a
 * Winograd conv's, transformed at compile time) and nothing views keeps no
 * bytes: an empty scratch buffer no kernel touches */
kiln_status cg_drop_unread(cg_module *m, kiln_error *err)
{
	bool *read = calloc((size_t)m->nbuf + 1, sizeof *read);
	if (!read)
		return ir_seterr(err, KILN_ENOMEM, "cg_drop_unread: out of memory");
	kiln_status st = KILN_OK;
	for (int k = 0; k < m->nkern; k++)
		cg_stmt_bufs(m->kern[k].body, mark_read, read);
	for (int b = 0; b < m->nbuf; b++)
		if (m->buf[b].alias >= 0)
			read[m->buf[b].alias] = true;
	for (int b = 0; b < m->nbuf && st == KILN_OK; b++) {
		cg_buf *w = &m->buf[b];
		if (read[b] || w->kind != CG_BUF_CONST || w->alias >= 0)
			continue;
		w->kind = CG_BUF_TEMP;
		w->data = NULL;
		w->numel = cg_const(m, KILN_I64, 0);
		if (!w->numel)
			st = ir_seterr(err, KILN_ENOMEM, "cg_drop_unread: out of memory");
	}
	free(read);
	return st;
}

kiln_status cg_prepack(cg_module *m, const cg_panels *pn, kiln_error *err)
{
	if (!m || !pn || pn->a < 0 || pn->b < 0 || (pn->b & (pn->b - 1)) || pn->b_wide < 0 ||
	    (pn->b_wide & (pn->b_wide - 1)))
		return ir_seterr(err, KILN_EINVAL, "cg_prepack: null module or bad panels %d, %d, %d",
		                 pn ? pn->a : 0, pn ? pn->b : 0, pn ? pn->b_wide : 0);
	ctx *c = calloc(1, sizeof *c);
	if (!c)
		return ir_seterr(err, KILN_ENOMEM, "cg_prepack: out of memory");
	c->m = m;
	c->P = pn->b;
	c->PW = pn->b > 0 ? pn->b_wide : 0;
	c->PA = pn->a;
	c->pn = *pn;
	for (int k = 0; k < m->nkern && c->st == KILN_OK; k++)
		walk(c, m->kern[k].body);
	if (c->st == KILN_OK)
		c->st = cg_drop_unread(m, NULL);
	kiln_status st = c->st;
	free(c);
	return st == KILN_OK ? KILN_OK : ir_seterr(err, st, "cg_prepack: out of memory");
}
