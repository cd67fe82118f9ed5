/*
 * memplan.c: cg_memplan, static memory planning of a kernel module's
 * temporaries.
 *
 * A TEMP buffer lives from the first to the last kernel that touches it or
 * any alias of it (an alias extends its base's lifetime).  Buffers are
 * placed in order of first use into slots, greedily: a slot is free for a
 * buffer when the last use of everything in it ended before the buffer's
 * first use (strictly before: a kernel that reads A and writes B must not
 * get them in the same bytes, since nothing says it reads A[i] before
 * writing B[i]).  Among free slots the best fit wins, by a size estimate
 * that counts every symbol (the batch) as 1: the smallest slot at least as
 * big, else the biggest (which grows).  Slot sizes themselves are computed
 * at run time, per bound batch, as the max over their buffers' numel.
 * INPUT, OUTPUT and CONST buffers and aliases get slot -1; a TEMP buffer no
 * kernel touches gets a slot anyway (any free one), so every non-alias
 * TEMP has memory.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

static int root(const cg_module *m, int b)
{
	while (m->buf[b].alias >= 0)
		b = m->buf[b].alias;
	return b;
}

static void touch(cg_module *m, int b, int t)
{
	if (b < 0 || b >= m->nbuf)
		return;
	cg_buf *r = &m->buf[root(m, b)];
	if (r->first < 0 || t < r->first)
		r->first = t;
	if (t > r->last)
		r->last = t;
}

typedef struct bufs_cb {
	void (*fn)(void *ctx, int buf, bool write);
	void *ctx;
} bufs_cb;

static void walk_expr(const bufs_cb *cb, const cg_expr *e)
{
	for (; e; e = e->c) {
		if (e->kind == CG_LOAD)
			cb->fn(cb->ctx, e->buf, false);
		walk_expr(cb, e->a);
		walk_expr(cb, e->b);
	}
}

static void walk(const bufs_cb *cb, const cg_stmt *s)
{
	if (!s)
		return;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			walk(cb, s->items[i]);
		break;
	case CG_FOR: walk(cb, s->body); break;
	case CG_STORE:
		cb->fn(cb->ctx, s->buf, true);
		walk_expr(cb, s->index);
		walk_expr(cb, s->value);
		break;
	case CG_ASSIGN: walk_expr(cb, s->value); break;
	case CG_IF:
		walk_expr(cb, s->cond);
		walk(cb, s->then_s);
		walk(cb, s->else_s);
		break;
	case CG_CHECK:
		walk_expr(cb, s->value);
		walk_expr(cb, s->lo);
		walk_expr(cb, s->hi);
		break;
	case CG_TRANSPOSE:
		cb->fn(cb->ctx, s->tr->src, false);
		cb->fn(cb->ctx, s->tr->dst, true);
		break;
	case CG_GEMM: {
		const cg_gemm *g = s->gemm;
		cb->fn(cb->ctx, g->a, false);
		cb->fn(cb->ctx, g->b, false);
		cb->fn(cb->ctx, g->c, true);
		if (g->bias_axis)
			cb->fn(cb->ctx, g->bias, false);
		if (g->has_residual)
			cb->fn(cb->ctx, g->residual, false);
		if (g->has_b_rows)
			cb->fn(cb->ctx, g->b_rows, false);
		const cg_gemm_vec *v[] = {&g->scale, &g->a_zero, &g->b_zero, &g->c_zero};
		for (int i = 0; i < 4; i++)
			if (v[i]->axis)
				cb->fn(cb->ctx, v[i]->buf, false);
		break;
	}
	}
}

void cg_stmt_bufs(const cg_stmt *s, void (*fn)(void *ctx, int buf, bool write), void *ctx)
{
	walk(&(bufs_cb){fn, ctx}, s);
}

typedef struct touch_ctx {
	cg_module *m;
	int t;
} touch_ctx;

static void touch_cb(void *ctx, int b, bool write)
{
	(void)write;
	touch_ctx *c = ctx;
	touch(c->m, b, c->t);
}

typedef struct slot {
	int64_t size; /* estimated bytes, symbols = 1 */
	int last;     /* last kernel using it */
} slot;

static int64_t estimate(const cg_buf *b)
{
	int64_t n = cg_expr_int(b->numel, NULL);
	return (n < 0 ? 1 : n) * (int64_t)kiln_dtype_size(b->dt);
}

/* Best fit among slots free before kernel `first`; -1 when none is. */
static int pick(const slot *s, int ns, int first, int64_t need)
{
	int fit = -1, big = -1;
	for (int i = 0; i < ns; i++) {
		if (s[i].last >= first)
			continue;
		if (s[i].size >= need && (fit < 0 || s[i].size < s[fit].size))
			fit = i;
		if (big < 0 || s[i].size > s[big].size)
			big = i;
	}
	return fit >= 0 ? fit : big;
}

static int by_first(const void *a, const void *b, void *ctx)
{
	const cg_buf *buf = ctx;
	const cg_buf *x = &buf[*(const int *)a], *y = &buf[*(const int *)b];
	if (x->first != y->first)
		return x->first < y->first ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

kiln_status cg_memplan(cg_module *m, kiln_error *err)
{
	if (!m)
		return ir_seterr(err, KILN_EINVAL, "cg_memplan: null module");
	for (int b = 0; b < m->nbuf; b++)
		m->buf[b].slot = m->buf[b].first = m->buf[b].last = -1;
	for (int t = 0; t < m->nkern; t++)
		cg_stmt_bufs(m->kern[t].body, touch_cb, &(touch_ctx){m, t});
	/* a chunked run executes its kernels once per chunk: a buffer it
	 * touches that is not internal to it (cg_buf.chunk) holds the whole
	 * batch, written or read chunk by chunk across the run, so it lives
	 * from the run's first kernel to its last */
	for (int r = 0; r < m->nchunk; r++) {
		const cg_chunk_run *c = &m->chunk[r];
		for (int b = 0; b < m->nbuf; b++) {
			cg_buf *cb = &m->buf[b];
			if (cb->alias >= 0 || cb->chunk == r || cb->first < 0 || cb->last < c->first ||
			    cb->first > c->last)
				continue;
			if (cb->first > c->first)
				cb->first = c->first;
			if (cb->last < c->last)
				cb->last = c->last;
		}
	}
	int *order = malloc((m->nbuf + 1) * sizeof *order), n = 0;
	slot *s = malloc((m->nbuf + 1) * sizeof *s);
	if (!order || !s) {
		free(order), free(s);
		return ir_seterr(err, KILN_ENOMEM, "cg_memplan: out of memory");
	}
	for (int b = 0; b < m->nbuf; b++) {
		cg_buf *cb = &m->buf[b];
		if (cb->kind != CG_BUF_TEMP || cb->alias >= 0)
			continue;
		if (cb->first < 0) /* untouched: lives after every kernel */
			cb->first = cb->last = m->nkern;
		order[n++] = b;
	}
	qsort_r(order, n, sizeof *order, by_first, m->buf);
	int ns = 0;
	for (int i = 0; i < n; i++) {
		cg_buf *cb = &m->buf[order[i]];
		int64_t need = estimate(cb);
		int k = pick(s, ns, cb->first, need);
		if (k < 0)
			s[k = ns++] = (slot){0, -1};
		if (need > s[k].size)
			s[k].size = need;
		s[k].last = cb->last;
		cb->slot = k;
	}
	for (int b = 0; b < m->nbuf; b++) /* aliases report their base's lifetime */
		if (m->buf[b].alias >= 0) {
			const cg_buf *r = &m->buf[root(m, b)];
			m->buf[b].first = r->first, m->buf[b].last = r->last;
		}
	m->nslot = ns;
	free(order), free(s);
	return KILN_OK;
}

/* ---- where a split step stops (cg_grad_split) ------------------------------
 * Per kernel, which roots it stores to (CG_STORE, a transpose's dst, a
 * GEMM's C) and which it touches at all. */

typedef struct access {
	const cg_module *m;
	uint8_t *stores, *touches; /* per root buffer, for the kernel being walked */
} access;

static void mark(access *a, int b, bool store)
{
	if (b < 0 || b >= a->m->nbuf)
		return;
	b = root(a->m, b);
	a->touches[b] = 1;
	a->stores[b] |= store;
}

static void acc_expr(access *a, const cg_expr *e)
{
	for (; e; e = e->c) {
		if (e->kind == CG_LOAD)
			mark(a, e->buf, false);
		acc_expr(a, e->a);
		acc_expr(a, e->b);
	}
}

static void acc_stmt(access *a, const cg_stmt *s)
{
	if (!s)
		return;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			acc_stmt(a, s->items[i]);
		break;
	case CG_FOR: acc_stmt(a, s->body); break;
	case CG_STORE:
		mark(a, s->buf, true);
		acc_expr(a, s->index);
		acc_expr(a, s->value);
		break;
	case CG_ASSIGN: acc_expr(a, s->value); break;
	case CG_IF:
		acc_expr(a, s->cond);
		acc_stmt(a, s->then_s);
		acc_stmt(a, s->else_s);
		break;
	case CG_CHECK:
		acc_expr(a, s->value);
		acc_expr(a, s->lo);
		acc_expr(a, s->hi);
		break;
	case CG_TRANSPOSE:
		mark(a, s->tr->src, false);
		mark(a, s->tr->dst, true);
		break;
	case CG_GEMM: {
		const cg_gemm *g = s->gemm;
		mark(a, g->c, true);
		int rd[] = {g->a, g->b, g->bias_axis ? g->bias : -1, g->has_residual ? g->residual : -1,
		            g->has_b_rows ? g->b_rows : -1, g->scale.axis ? g->scale.buf : -1,
		            g->a_zero.axis ? g->a_zero.buf : -1, g->b_zero.axis ? g->b_zero.buf : -1,
		            g->c_zero.axis ? g->c_zero.buf : -1};
		for (size_t i = 0; i < sizeof rd / sizeof rd[0]; i++)
			mark(a, rd[i], false);
		break;
	}
	}
}

kiln_status cg_grad_split(const cg_module *m, const int *bufs, int n, int *ready, int *split,
                          kiln_error *err)
{
	access a = {m, calloc((size_t)m->nbuf + 1, 1), calloc((size_t)m->nbuf + 1, 1)};
	int *touch = calloc((size_t)n * (size_t)m->nkern + 1, sizeof *touch);
	kiln_status st = KILN_OK;
	if (!a.stores || !a.touches || !touch) {
		st = ir_seterr(err, KILN_ENOMEM, "out of memory");
		goto out;
	}
	*split = 0;
	for (int i = 0; i < n; i++)
		ready[i] = -1;
	for (int k = 0; k < m->nkern; k++) {
		memset(a.stores, 0, (size_t)m->nbuf);
		memset(a.touches, 0, (size_t)m->nbuf);
		acc_stmt(&a, m->kern[k].body);
		for (int i = 0; i < n; i++) {
			int r = root(m, bufs[i]);
			touch[(size_t)i * (size_t)m->nkern + (size_t)k] = a.touches[r];
			if (a.stores[r] && k + 1 > *split)
				*split = k + 1;
			if (a.stores[r])
				ready[i] = k;
		}
	}
	for (int i = 0; i < n; i++) {
		if (ready[i] < 0) {
			st = ir_seterr(err, KILN_EUNSUPPORTED, "gradient buffer %d is written by no kernel",
			               bufs[i]);
			goto out;
		}
		/* backward may read a finished gradient (BatchNorm's dx reads
		 * dgamma): the bucket is final after its last reader, too */
		for (int k = ready[i]; k < *split; k++)
			if (touch[(size_t)i * (size_t)m->nkern + (size_t)k])
				ready[i] = k;
	}
out:
	free(a.stores), free(a.touches), free(touch);
	return st;
}

int cg_last_store(const cg_module *m, int buf)
{
	access a = {m, calloc((size_t)m->nbuf + 1, 1), calloc((size_t)m->nbuf + 1, 1)};
	int last = -1;
	for (int k = 0; a.stores && a.touches && k < m->nkern; k++) {
		memset(a.stores, 0, (size_t)m->nbuf);
		acc_stmt(&a, m->kern[k].body);
		if (a.stores[root(m, buf)])
			last = k;
	}
	free(a.stores), free(a.touches);
	return last;
}
