/*
 * chunk.c: cg_chunk, batch-chunked execution of runs of per-sample kernels.
 *
 * Every kernel runs over the whole batch before the next one starts, so at
 * batch 16 an early layer's output (MobileNetV2's 16->96 expansion at
 * 112x112: 4.8 MB per image) goes out to memory and comes back for the
 * next kernel.  A run of consecutive kernels that each compute sample n
 * from sample n alone can instead be executed chunk by chunk: kernels
 * first..last on samples [0, c), then on [c, 2c), ..., with the batch
 * symbol bound to the chunk's size and the pointers of the buffers that
 * cross the run's edge moved to the chunk's first sample.  The buffers
 * internal to the run then hold one chunk, in the same bytes for every
 * chunk, and stay in cache.  The driver (runtime/model.c) does the
 * looping; this file decides where, from the kernel IR and the graph:
 *
 * - a kernel may be chunked when its node is per-sample (elementwise,
 *   convolutions, pools, inference BatchNorm, MatMul/Gemm over rows,
 *   Softmax/LayerNorm/Concat on an axis other than 0) and every buffer it
 *   touches either does not depend on the batch symbol (weights; read
 *   only, unless it is the kernel's own scratch) or is sample-major: dim 0
 *   is the symbol itself and no other dim depends on it.  A kernel's own
 *   scratch (touched by it alone, or by its unit of guarded kernels below)
 *   may have any layout.
 * - the chunk: the kernel's per-sample bytes (activations and scratch
 *   touched) against the cache budget (the host's L2 per core) less its
 *   weights, rounded down to a power of two; 64 or more samples is not
 *   chunked (the batch already fits), nor is a kernel whose chunk would
 *   hold fewer bytes than its weights, which every chunk reads again.
 *   Consecutive chunkable kernels on one symbol form a run while their
 *   chunks stay within 4x of the run's smallest, which the run takes; a
 *   run needs two kernels (a kernel alone keeps no intermediate in cache).
 * - runs are made of whole units: the kernels one node was lowered to
 *   (a Winograd conv's copies, transforms and GEMMs, which share scratch
 *   in their own layouts) and a maximal sequence of kernels guarded by a
 *   choice made on the batch (cg_kernel.guard: the two algorithms of a
 *   conv), chunked whole or not at all, since each guard is tested on the
 *   chunk's size.
 * - a buffer touched only inside a run, all of whose alias class is TEMP,
 *   is internal (cg_buf.chunk); cg_memplan keeps the rest alive across the
 *   run.
 *
 * KILN_CHUNK (compile time, read by the driver) overrides it: 0 turns
 * chunking off, n > 0 chunks every chunkable run by n samples.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>

#include "codegen/codegen.h"

enum { MAX_CHUNK = 64 };

int64_t cg_host_l2_bytes(void)
{
	long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
	v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
	return v > 0 ? (int64_t)v : (int64_t)1 << 20;
}

static bool uses_sym(const cg_expr *e, int s)
{
	for (; e; e = e->c) {
		if (e->kind == CG_SIZE && e->var == s)
			return true;
		if (uses_sym(e->a, s) || uses_sym(e->b, s))
			return true;
	}
	return false;
}

/* Some symbol e uses, or -1. */
static int any_sym(const cg_expr *e)
{
	for (; e; e = e->c) {
		if (e->kind == CG_SIZE)
			return e->var;
		int s = any_sym(e->a);
		if (s < 0)
			s = any_sym(e->b);
		if (s >= 0)
			return s;
	}
	return -1;
}

/* dim 0 is symbol s and no other dim depends on it */
static bool sample_major(const cg_buf *b, int s)
{
	if (b->type.rank < 1 || !b->dim[0] || b->dim[0]->kind != CG_SIZE || b->dim[0]->var != s)
		return false;
	for (int d = 1; d < b->type.rank; d++)
		if (b->dim[d] && uses_sym(b->dim[d], s))
			return false;
	return true;
}

static int root(const cg_module *m, int b)
{
	while (m->buf[b].alias >= 0)
		b = m->buf[b].alias;
	return b;
}

static int axis_of(const ir_node *n, const char *name, int64_t dflt, int rank)
{
	int64_t a = ir_attr_int(n, name, dflt);
	return (int)(a < 0 ? a + rank : a);
}

/* Whether node n computes output sample i from input sample i alone (given
 * that its buffers are sample-major or batch-free, checked separately). */
static bool per_sample_op(const kiln_graph *g, const ir_node *n)
{
	const ir_op_info *op = ir_op(n->op);
	if (op->flags & IR_RANDOM)
		return false;
	if (op->flags & IR_ELEM)
		return true;
	const ir_value *out = n->nout ? ir_val(g, n->out[0]) : NULL;
	int rank = out ? (int)out->type.rank : 0;
	switch (n->op) {
	case KILN_OP_CONV:
	case KILN_OP_MAX_POOL:
	case KILN_OP_AVERAGE_POOL:
	case KILN_OP_GLOBAL_AVERAGE_POOL:
	case KILN_OP_MATMUL:
	case KILN_OP_GEMM: /* rows of A: a transposed A is not sample-major */
		return true;
	case KILN_OP_BATCH_NORM: return ir_attr_int(n, "training_mode", 0) == 0;
	case KILN_OP_SOFTMAX:
	case KILN_OP_LOG_SOFTMAX:
	case KILN_OP_LAYER_NORM: return axis_of(n, "axis", -1, rank) > 0;
	case KILN_OP_CONCAT: return axis_of(n, "axis", 0, rank) > 0;
	default: return false;
	}
}

typedef struct touch {
	int buf;
	bool write;
} touch;

typedef struct kinfo {
	touch *t;
	int n, cap;
	int sym;       /* the batch symbol its sample-major buffers share; -1: none */
	int chunk;     /* samples per chunk it wants; 0: not chunkable */
} kinfo;

typedef struct collect {
	kinfo *k;
	bool oom;
} collect;

static void add_touch(void *ctx, int b, bool write)
{
	collect *c = ctx;
	kinfo *k = c->k;
	for (int i = 0; i < k->n; i++)
		if (k->t[i].buf == b) {
			k->t[i].write |= write;
			return;
		}
	if (k->n == k->cap) {
		int nc = k->cap ? 2 * k->cap : 8;
		touch *t = realloc(k->t, (size_t)nc * sizeof *t);
		if (!t) {
			c->oom = true;
			return;
		}
		k->t = t, k->cap = nc;
	}
	k->t[k->n++] = (touch){b, write};
}

typedef struct plan {
	cg_module *m;
	const cg_chunk_opts *o;
	kinfo *ki;
	int *first, *last; /* per root: kernels touching its class */
	bool *io;          /* per root: its class holds a non-TEMP buffer */
	int *u0, *u1;      /* per kernel: its unit [u0, u1) (see unit()) */
} plan;

static int64_t bytes_at(const cg_module *m, const cg_buf *b, int s, int64_t n)
{
	int64_t sym[64];
	int ns = m->nsym < 64 ? m->nsym : 64;
	for (int i = 0; i < ns; i++)
		sym[i] = i == s ? n : 1;
	int64_t v = cg_expr_int(b->numel, m->nsym <= 64 ? sym : NULL);
	return v < 0 ? 0 : v * (int64_t)kiln_dtype_size(b->dt);
}

/* Fills ki->sym and ki->chunk for kernel k.  A buffer whose class lives
 * within k's unit (a Winograd conv's transformed tiles) may have any layout:
 * the unit always runs whole on one chunk. */
static void judge(plan *p, int k)
{
	cg_module *m = p->m;
	kinfo *ki = &p->ki[k];
	const cg_kernel *kern = &m->kern[k];
	ki->sym = -1, ki->chunk = 0;
	if (!m->g || kern->node >= m->g->nnode || !per_sample_op(m->g, m->g->node[kern->node]))
		return;
	for (int i = 0; i < ki->n && ki->sym < 0; i++) { /* the symbol: a sample-major buffer's */
		const cg_buf *b = &m->buf[ki->t[i].buf];
		if (b->type.rank >= 1 && b->dim[0] && b->dim[0]->kind == CG_SIZE)
			ki->sym = b->dim[0]->var;
	}
	for (int i = 0; i < ki->n && ki->sym < 0; i++) /* else any size it is scaled by */
		ki->sym = any_sym(m->buf[ki->t[i].buf].numel);
	int s = ki->sym;
	if (s < 0)
		return;
	int64_t per = 0, fixed = 0;
	for (int i = 0; i < ki->n; i++) {
		int id = ki->t[i].buf, r = root(m, id);
		const cg_buf *b = &m->buf[id];
		bool own = m->buf[r].kind == CG_BUF_TEMP && !p->io[r] && p->first[r] >= p->u0[k] &&
		           p->last[r] < p->u1[k];
		if (!own && !uses_sym(b->numel, s)) {
			if (ki->t[i].write)
				return; /* a batch-free result: written again per chunk */
		} else if (!own && (!sample_major(b, s) ||
		                    bytes_at(m, b, s, 1) != bytes_at(m, &m->buf[r], s, 1) ||
		                    bytes_at(m, b, s, 2) != bytes_at(m, &m->buf[r], s, 2))) {
			return; /* kernels see the class's pointer: moved by the root's sample */
		}
		int64_t b1 = bytes_at(m, b, s, 1), b2 = bytes_at(m, b, s, 2);
		per += b2 - b1;
		fixed += b1 - (b2 - b1);
	}
	if (per <= 0)
		return;
	int64_t c = p->o->force;
	if (c <= 0) {
		int64_t room = p->o->cache_bytes - fixed;
		c = room > per ? room / per : 1;
		/* every chunk reads the batch-free bytes (the weights) again: a
		 * chunk whose samples hold fewer bytes than those re-reads more
		 * than it keeps in cache.  A Linear with 1.6 MB of weights
		 * beside a 1 MB L2 (Zen 4) was run one sample at a time, as 16
		 * GEMMs of one row at batch 16 where one of 16 rows streams the
		 * weights once: the bench MLP 0.62 ms against 0.22 unchunked. */
		if (c >= MAX_CHUNK || c * per < fixed)
			return;
	}
	int64_t pow2 = 1;
	while (pow2 * 2 <= c)
		pow2 *= 2;
	ki->chunk = (int)(p->o->force > 0 ? c : pow2);
}

/* The end (exclusive) of the unit starting at kernel k: the kernels one
 * node was lowered to (a Winograd conv's transforms and GEMMs), and a
 * maximal sequence of guarded kernels (both algorithms of a conv). */
static int unit_end(const cg_module *m, int k)
{
	int e = k + 1;
	while (e < m->nkern && (m->kern[e].node == m->kern[k].node ||
	                        (m->kern[k].guard && m->kern[e].guard)))
		e++;
	return e;
}

/* The unit starting at kernel k: its end (exclusive), symbol and chunk
 * (0: not chunkable). */
static int unit(const plan *p, int k, int *sym, int *chunk)
{
	const cg_module *m = p->m;
	int e = p->u1[k];
	*sym = p->ki[k].sym, *chunk = p->ki[k].chunk;
	for (int j = k; j < e; j++) {
		int a = m->kern[j].alt;
		if (p->ki[j].chunk <= 0 || p->ki[j].sym != *sym || (a >= 0 && (a < k || a >= e))) {
			*chunk = 0;
			break;
		}
		if (p->ki[j].chunk < *chunk)
			*chunk = p->ki[j].chunk;
	}
	return e;
}

static kiln_status add_run(plan *p, int first, int last, int sym, int chunk)
{
	cg_module *m = p->m;
	int r = m->nchunk;
	cg_chunk_run *c = &m->chunk[r];
	*c = (cg_chunk_run){.first = first, .last = last, .sym = sym, .chunk = chunk};
	int n = 0;
	for (int k = first; k <= last; k++)
		n += p->ki[k].n;
	c->off = ir_alloc(m->arena, (size_t)(n + 1) * sizeof *c->off);
	if (!c->off)
		return KILN_ENOMEM;
	for (int b = 0; b < m->nbuf; b++) {
		int rt = root(m, b);
		if (m->buf[rt].kind == CG_BUF_TEMP && !p->io[rt] && p->first[rt] >= first &&
		    p->last[rt] <= last)
			m->buf[b].chunk = r;
	}
	for (int k = first; k <= last; k++)
		for (int i = 0; i < p->ki[k].n; i++) {
			int b = root(m, p->ki[k].t[i].buf); /* a kernel reads its class's pointer */
			if (m->buf[b].chunk == r || !uses_sym(m->buf[b].numel, sym))
				continue;
			bool seen = false;
			for (int j = 0; j < c->noff && !seen; j++)
				seen = c->off[j] == b;
			if (!seen)
				c->off[c->noff++] = b;
		}
	m->nchunk++;
	if (getenv("KILN_CHUNK_DEBUG")) {
		fprintf(stderr, "run %d: %s..%s chunk %d off", r, m->kern[first].name, m->kern[last].name, chunk);
		for (int i = 0; i < c->noff; i++)
			fprintf(stderr, " %d", c->off[i]);
		fprintf(stderr, " internal");
		for (int b = 0; b < m->nbuf; b++)
			if (m->buf[b].chunk == r)
				fprintf(stderr, " %d", b);
		fprintf(stderr, "\n");
	}
	return KILN_OK;
}

kiln_status cg_chunk(cg_module *m, const cg_chunk_opts *o, kiln_error *err)
{
	if (!m || !o)
		return ir_seterr(err, KILN_EINVAL, "cg_chunk: null argument");
	m->nchunk = 0;
	for (int b = 0; b < m->nbuf; b++)
		m->buf[b].chunk = -1;
	if (o->force < 0 || m->nsym == 0 || m->nkern < 2)
		return KILN_OK;
	plan p = {.m = m, .o = o};
	p.ki = calloc((size_t)m->nkern, sizeof *p.ki);
	p.first = malloc((size_t)m->nbuf * sizeof *p.first);
	p.last = malloc((size_t)m->nbuf * sizeof *p.last);
	p.io = calloc((size_t)m->nbuf, sizeof *p.io);
	m->chunk = ir_alloc(m->arena, (size_t)m->nkern * sizeof *m->chunk);
	kiln_status st = p.ki && p.first && p.last && p.io && m->chunk ? KILN_OK : KILN_ENOMEM;
	for (int b = 0; st == KILN_OK && b < m->nbuf; b++) {
		p.first[b] = p.last[b] = -1;
		if (m->buf[b].kind != CG_BUF_TEMP)
			p.io[root(m, b)] = true;
	}
	for (int k = 0; st == KILN_OK && k < m->nkern; k++) {
		collect c = {&p.ki[k], false};
		cg_stmt_bufs(m->kern[k].body, add_touch, &c);
		if (c.oom)
			st = KILN_ENOMEM;
		for (int i = 0; st == KILN_OK && i < p.ki[k].n; i++) {
			int r = root(m, p.ki[k].t[i].buf);
			if (p.first[r] < 0)
				p.first[r] = k;
			p.last[r] = k;
		}
	}
	p.u0 = malloc((size_t)m->nkern * sizeof *p.u0);
	p.u1 = malloc((size_t)m->nkern * sizeof *p.u1);
	if (st == KILN_OK && (!p.u0 || !p.u1))
		st = KILN_ENOMEM;
	for (int k = 0; st == KILN_OK && k < m->nkern;) {
		int e = unit_end(m, k);
		for (int j = k; j < e; j++)
			p.u0[j] = k, p.u1[j] = e;
		k = e;
	}
	for (int k = 0; st == KILN_OK && k < m->nkern; k++) {
		judge(&p, k);
		if (getenv("KILN_CHUNK_DEBUG"))
			fprintf(stderr, "%s: chunk %d\n", m->kern[k].name, p.ki[k].chunk);
	}
	for (int k = 0; st == KILN_OK && k < m->nkern;) {
		int sym, chunk, e = unit(&p, k, &sym, &chunk);
		if (chunk <= 0) {
			k = e;
			continue;
		}
		int first = k, rc = chunk;
		for (;;) { /* take every chunkable unit that follows */
			int s2, c2, e2;
			if (e >= m->nkern)
				break;
			e2 = unit(&p, e, &s2, &c2);
			if (c2 <= 0 || s2 != sym)
				break;
			rc = c2 < rc ? c2 : rc;
			e = e2;
		}
		if (e - 1 > first)
			st = add_run(&p, first, e - 1, sym, rc);
		k = e;
	}
	for (int k = 0; p.ki && k < m->nkern; k++)
		free(p.ki[k].t);
	free(p.ki), free(p.first), free(p.last), free(p.io), free(p.u0), free(p.u1);
	if (st != KILN_OK) {
		m->nchunk = 0;
		return ir_seterr(err, st, "cg_chunk: out of memory");
	}
	return KILN_OK;
}
