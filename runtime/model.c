/*
 * model.c: the driver of a generated library: binds the batch symbol,
 * checks inputs against the signature, plans the scratch arena and runs the
 * kernels in order.
 *
 * The LLVM backend emits only arithmetic and one constant rt_model_desc
 * (runtime/model.h); everything else is this file, linked statically into
 * every generated .so (for its typed entry points) and into the kiln
 * runtime (for kiln_load).  A context owns the buffer pointer table, the
 * symbol values, the caller thread's GEMM scratch, the thread pool and the
 * scratch arena, so two threads use two contexts and nothing is global.
 *
 * The key idea is that every check happens before the first kernel: inputs
 * bind the symbols (each RT_DIM_SYM dim either binds its symbol or must
 * agree with the value another input bound), then every fixed, symbolic and
 * EXPR dim (from the generated io_dims) of every input and output is
 * compared, and only then is the arena sized.  The arena is allocated at
 * the first run and replaced only when a larger batch needs more bytes, so
 * steady-state runs never allocate (page faults are expensive here).
 *
 * Aliases: buffers linked by `alias` form a class sharing one pointer, its
 * "home": the class's output buffer if it has one (so a view of an output
 * is written straight into the caller's memory), else its input, else the
 * root (a constant, or a TEMP slot).  When a class holds an input or a
 * constant and an output (y = reshape(x)), the bytes are copied into the
 * output before the kernels; a second output of the class is copied from
 * the home after them.
 *
 * State (RT_BUF_STATE, training libraries): parameters, buffers and
 * optimizer state live in per-context storage, initialised from the
 * description's state table at create, or shared with a training context
 * (model_train.c) that runs two programs over one state.  To the kernels a
 * state tensor is just another pointer, ranked like a constant for aliases.
 *
 * Generated libraries must not export kiln_* symbols, so this file keeps
 * its own small dtype table instead of calling tensor.c.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "rt.h"
#include "runtime/model.h"

enum { MAX_THREADS = 256, ALIGN = 64 };
#define HUGE_PAGE ((size_t)2 << 20)

static const struct {
	const char *name;
	size_t size;
} dtypes[KILN_DT_COUNT] = {
	[KILN_F32] = {"f32", 4}, [KILN_F64] = {"f64", 8}, [KILN_F16] = {"f16", 2},
	[KILN_BF16] = {"bf16", 2}, [KILN_I8] = {"i8", 1}, [KILN_U8] = {"u8", 1},
	[KILN_I32] = {"i32", 4}, [KILN_I64] = {"i64", 8}, [KILN_BOOL] = {"bool", 1},
};

typedef struct copy {
	int32_t from, to; /* buffer ids */
} copy;

struct rt_model {
	const rt_model_desc *d;
	rt_pool *pool;
	int nthreads;
	float *scratch;      /* the caller thread's GEMM scratch */
	void **buf;          /* per buffer: what kernels see */
	int32_t *home;       /* per buffer: the buffer whose pointer it shares */
	int32_t *io_of;      /* per buffer: its input or output index, or -1 */
	int64_t *numel;      /* per buffer, for the current symbols */
	int64_t *sym;        /* symbol values; 0: unbound */
	int32_t *bound_by;   /* per symbol: the input that bound it */
	int64_t *dims;       /* every input then output dim, flattened */
	int32_t *dim_off;    /* per io (inputs, then outputs): offset in dims */
	size_t *slot_off;    /* per slot: offset in the arena */
	copy *pre, *post;    /* alias copies before and after the kernels */
	int npre, npost;
	void *arena;
	size_t arena_bytes;
	void **state;        /* per state tensor: its storage */
	bool own_state;      /* allocated here (else the caller's) */
	uint64_t *prof;      /* per kernel: wall ns summed over runs (rt_model_set_profile) */
	uint32_t nchunk;     /* the description's chunked runs (0 before ABI 5) */
	void **cbuf;         /* a chunk's pointers: buf with the run's off[] moved */
	int64_t *csym;       /* a chunk's symbols */
	int64_t *cnumel;     /* numel for a run's chunk (plan_arena) */
	/* chunks on threads (run_chunked_par): thread t > 0 keeps the internal
	 * buffers of a run at arena + treg + (t - 1) * treg_bytes + toff[b] */
	void **tbuf;         /* per thread: its chunk's pointers (nthreads x nbuf) */
	int64_t *tsym;       /* per thread: its chunk's symbols (nthreads x nsym) */
	size_t *toff;        /* per buffer internal to a run: offset in a thread's region */
	size_t *tslot;       /* per slot: scratch for plan_arena */
	size_t treg, treg_bytes;
	char err[1024];
};

static kiln_status fail(rt_model *m, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static kiln_status fail(rt_model *m, kiln_status code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m->err, sizeof m->err, fmt, ap);
	va_end(ap);
	return code;
}

static bool dtype_ok(int32_t dt)
{
	return dt > KILN_DT_INVALID && dt < KILN_DT_COUNT;
}

static const char *dt_name(int32_t dt)
{
	return dtype_ok(dt) ? dtypes[dt].name : "?";
}

static uint32_t nio(const rt_model_desc *d)
{
	return d->ninputs + d->noutputs;
}

/* Input i, then output i - ninputs: the flattened signature order. */
static const rt_io_desc *io_at(const rt_model_desc *d, uint32_t i)
{
	return i < d->ninputs ? &d->inputs[i] : &d->outputs[i - d->ninputs];
}

static const char *io_kind(const rt_model_desc *d, uint32_t i)
{
	return i < d->ninputs ? "input" : "output";
}

/* ---- validating a description -------------------------------------------- */

static kiln_status check_io(const rt_model_desc *d, uint32_t i, char *msg, size_t size)
{
	const rt_io_desc *io = io_at(d, i);
	const char *what = io_kind(d, i);
	if (!io->name || !dtype_ok(io->dtype) || io->rank < 0 || io->rank > KILN_MAX_RANK ||
	    (io->rank && (!io->dims || !io->dim_kind)) || io->buf < 0 || (uint32_t)io->buf >= d->nbuf)
		return snprintf(msg, size, "%s %u: bad name, dtype, rank or buffer", what, i),
		       KILN_EINVAL;
	if (d->bufs[io->buf].kind != (i < d->ninputs ? RT_BUF_INPUT : RT_BUF_OUTPUT))
		return snprintf(msg, size, "%s '%s': buffer %d is not an %s buffer", what, io->name,
		                io->buf, what),
		       KILN_EINVAL;
	for (int k = 0; k < io->rank; k++) {
		int32_t kind = io->dim_kind[k];
		bool ok = kind == RT_DIM_FIXED   ? io->dims[k] >= 0
		          : kind == RT_DIM_SYM  ? io->dims[k] >= 0 && io->dims[k] < d->nsym
		          : kind == RT_DIM_EXPR ? d->io_dims != NULL
		                                : false;
		if (!ok)
			return snprintf(msg, size, "%s '%s': bad dim %d", what, io->name, k), KILN_EINVAL;
	}
	return KILN_OK;
}

/* The state table: names, dtypes and fixed shapes with initial data. */
static kiln_status check_state(const rt_model_desc *d, char *msg, size_t size)
{
	if (d->nstate && !d->state)
		return snprintf(msg, size, "model description has a NULL state table"), KILN_EINVAL;
	for (uint32_t i = 0; i < d->nstate; i++) {
		const rt_state_desc *s = &d->state[i];
		bool ok = s->name && dtype_ok(s->dtype) && s->rank >= 0 && s->rank <= KILN_MAX_RANK &&
		          (!s->rank || s->dims) && s->init;
		for (int k = 0; ok && k < s->rank; k++)
			ok = s->dims[k] >= 0;
		if (!ok)
			return snprintf(msg, size, "state %u: bad name, dtype, shape or data", i),
			       KILN_EINVAL;
	}
	return KILN_OK;
}

static bool slot_ok(const rt_model_desc *d, const rt_buf_desc *bd)
{
	if (bd->kind != RT_BUF_STATE)
		return bd->slot < (int32_t)d->nslot;
	return bd->slot >= 0 && (uint32_t)bd->slot < d->nstate && bd->alias < 0 &&
	       d->state[bd->slot].dtype == bd->dtype;
}

static kiln_status check_bufs(const rt_model_desc *d, char *msg, size_t size)
{
	for (uint32_t b = 0; b < d->nbuf; b++) {
		const rt_buf_desc *bd = &d->bufs[b];
		bool ok = bd->kind >= RT_BUF_INPUT && bd->kind <= RT_BUF_STATE && dtype_ok(bd->dtype) &&
		          bd->alias < (int32_t)d->nbuf && slot_ok(d, bd) &&
		          (bd->kind != RT_BUF_CONST || bd->data || bd->alias >= 0);
		if (!ok)
			return snprintf(msg, size, "buffer %u: bad kind, dtype, slot, alias or data", b),
			       KILN_EINVAL;
		/* an alias chain longer than nbuf is a cycle; a TEMP root without
		 * a slot is one no kernel touches (its pointer stays NULL) */
		int32_t r = (int32_t)b;
		for (uint32_t steps = 0; d->bufs[r].alias >= 0; steps++, r = d->bufs[r].alias)
			if (steps > d->nbuf)
				return snprintf(msg, size, "buffer %u: alias cycle", b), KILN_EINVAL;
	}
	return KILN_OK;
}

/* Runs in order, disjoint, inside the kernels; off[] and chunk_of name
 * buffers and runs. */
static kiln_status check_chunks(const rt_model_desc *d, char *msg, size_t size)
{
	if (d->nchunk && (!d->chunks || !d->chunk_of))
		return snprintf(msg, size, "model description has a NULL chunk table"), KILN_EINVAL;
	int32_t next = 0;
	for (uint32_t r = 0; r < d->nchunk; r++) {
		const rt_chunk_desc *c = &d->chunks[r];
		bool ok = c->first >= next && c->first <= c->last && (uint32_t)c->last < d->nkern &&
		          c->sym >= 0 && (uint32_t)c->sym < d->nsym && c->chunk >= 1 && c->noff >= 0 &&
		          (c->noff == 0 || c->off);
		for (int32_t i = 0; ok && i < c->noff; i++)
			ok = c->off[i] >= 0 && (uint32_t)c->off[i] < d->nbuf;
		if (!ok)
			return snprintf(msg, size, "chunked run %u: bad kernels, symbol, chunk or buffers",
			                r), KILN_EINVAL;
		next = c->last + 1;
	}
	for (uint32_t b = 0; d->nchunk && b < d->nbuf; b++)
		if (d->chunk_of[b] < -1 || d->chunk_of[b] >= (int32_t)d->nchunk)
			return snprintf(msg, size, "buffer %u: bad chunked run", b), KILN_EINVAL;
	return KILN_OK;
}

kiln_status rt_model_validate(const rt_model_desc *d, char *msg, size_t size)
{
	if (!d)
		return snprintf(msg, size, "no model description"), KILN_EINVAL;
	if (d->abi < RT_MODEL_ABI_MIN)
		return snprintf(msg, size, "model ABI %u was written by an older kiln; this runtime "
		                "reads ABI %d to %d: compile the model again with this kiln",
		                d->abi, RT_MODEL_ABI_MIN, RT_MODEL_ABI),
		       KILN_EUNSUPPORTED;
	if (d->abi > RT_MODEL_ABI)
		return snprintf(msg, size, "model ABI %u was written by a newer kiln; this runtime "
		                "reads ABI %d to %d", d->abi, RT_MODEL_ABI_MIN, RT_MODEL_ABI),
		       KILN_EUNSUPPORTED;
	if (!d->name || (d->nsym && !d->sym_names) || (d->ninputs && !d->inputs) ||
	    (d->noutputs && !d->outputs) || (d->nbuf && (!d->bufs || !d->numel)) ||
	    (d->nkern && !d->kernels))
		return snprintf(msg, size, "model description has a NULL table"), KILN_EINVAL;
	for (uint32_t k = 0; k < d->nkern; k++)
		if (!d->kernels[k])
			return snprintf(msg, size, "kernel %u is NULL", k), KILN_EINVAL;
	for (uint32_t s = 0; s < d->nsym; s++)
		if (!d->sym_names[s])
			return snprintf(msg, size, "symbol %u has no name", s), KILN_EINVAL;
	kiln_status st = check_state(d, msg, size);
	if (st == KILN_OK)
		st = check_bufs(d, msg, size);
	if (st == KILN_OK && d->abi >= 5)
		st = check_chunks(d, msg, size);
	for (uint32_t i = 0; st == KILN_OK && i < nio(d); i++)
		st = check_io(d, i, msg, size);
	return st;
}

/* ---- creating a context --------------------------------------------------- */

static int32_t root_of(const rt_model_desc *d, int32_t b)
{
	while (d->bufs[b].alias >= 0)
		b = d->bufs[b].alias;
	return b;
}

/* Picks each alias class's home and the copies it needs (see the top). */
static kiln_status plan_aliases(rt_model *m)
{
	const rt_model_desc *d = m->d;
	static const int rank[] = {[RT_BUF_OUTPUT] = 3, [RT_BUF_INPUT] = 2, [RT_BUF_CONST] = 1,
	                           [RT_BUF_STATE] = 1, [RT_BUF_TEMP] = 0};
	for (uint32_t b = 0; b < d->nbuf; b++)
		m->home[b] = -1;
	for (uint32_t b = 0; b < d->nbuf; b++) {
		int32_t r = root_of(d, (int32_t)b), h = m->home[r];
		if (h < 0 || rank[d->bufs[b].kind] > rank[d->bufs[h].kind])
			m->home[r] = (int32_t)b;
	}
	for (uint32_t b = 0; b < d->nbuf; b++) {
		int32_t h = m->home[root_of(d, (int32_t)b)];
		m->home[b] = h;
		if ((int32_t)b == h)
			continue;
		int kind = d->bufs[b].kind;
		if (kind == RT_BUF_OUTPUT)
			m->post[m->npost++] = (copy){h, (int32_t)b};
		else if ((kind == RT_BUF_INPUT || kind == RT_BUF_CONST || kind == RT_BUF_STATE) &&
		         d->bufs[h].kind == RT_BUF_OUTPUT)
			m->pre[m->npre++] = (copy){(int32_t)b, h};
	}
	return KILN_OK;
}

static size_t dims_total(const rt_model_desc *d)
{
	size_t n = 0;
	for (uint32_t i = 0; i < nio(d); i++)
		n += io_at(d, i)->rank;
	return n;
}

static kiln_status alloc_tables(rt_model *m)
{
	const rt_model_desc *d = m->d;
	size_t nb = d->nbuf + 1, ns = d->nsym + 1;
	m->buf = calloc(nb, sizeof *m->buf);
	m->home = calloc(nb, sizeof *m->home);
	m->io_of = calloc(nb, sizeof *m->io_of);
	m->numel = calloc(nb, sizeof *m->numel);
	m->pre = calloc(nb, sizeof *m->pre);
	m->post = calloc(nb, sizeof *m->post);
	m->sym = calloc(ns, sizeof *m->sym);
	m->bound_by = calloc(ns, sizeof *m->bound_by);
	m->dims = calloc(dims_total(d) + 1, sizeof *m->dims);
	m->dim_off = calloc(nio(d) + 1, sizeof *m->dim_off);
	m->slot_off = calloc(d->nslot + 1, sizeof *m->slot_off);
	m->nchunk = d->abi >= 5 ? d->nchunk : 0;
	m->cbuf = calloc(nb, sizeof *m->cbuf);
	m->csym = calloc(ns, sizeof *m->csym);
	m->cnumel = calloc(nb, sizeof *m->cnumel);
	m->toff = calloc(nb, sizeof *m->toff);
	m->tslot = calloc(d->nslot + 1, sizeof *m->tslot);
	if (!m->toff || !m->tslot)
		return KILN_ENOMEM;
	if (!m->buf || !m->home || !m->io_of || !m->numel || !m->pre || !m->post || !m->sym || !m->bound_by ||
	    !m->dims || !m->dim_off || !m->slot_off || !m->cbuf || !m->csym || !m->cnumel)
		return KILN_ENOMEM;
	for (uint32_t i = 0, off = 0; i < nio(d); off += io_at(d, i)->rank, i++)
		m->dim_off[i] = (int32_t)off;
	for (uint32_t b = 0; b < d->nbuf; b++)
		m->io_of[b] = -1;
	for (uint32_t i = 0; i < d->ninputs; i++)
		m->io_of[d->inputs[i].buf] = (int32_t)i;
	for (uint32_t i = 0; i < d->noutputs; i++)
		m->io_of[d->outputs[i].buf] = (int32_t)i;
	return KILN_OK;
}

static kiln_status alloc_scratch(float **p, uint64_t floats)
{
	*p = NULL;
	if (floats > SIZE_MAX / 8)
		return KILN_ENOMEM;
	size_t bytes = (size_t)(floats * sizeof(float) + ALIGN - 1) / ALIGN * ALIGN;
	if (bytes && posix_memalign((void **)p, ALIGN, bytes) != 0)
		return KILN_ENOMEM;
	return KILN_OK;
}

static size_t state_bytes(const rt_state_desc *s)
{
	size_t n = dtypes[s->dtype].size;
	for (int k = 0; k < s->rank; k++)
		n *= (size_t)s->dims[k];
	return n;
}

/* Own state storage, a copy of the initial values (state given: shared). */
static kiln_status attach_state(rt_model *m, void *const *state)
{
	const rt_model_desc *d = m->d;
	if (!d->nstate)
		return KILN_OK;
	if (!(m->state = calloc(d->nstate, sizeof *m->state)))
		return KILN_ENOMEM;
	m->own_state = !state;
	for (uint32_t i = 0; i < d->nstate; i++) {
		size_t n = state_bytes(&d->state[i]);
		if (state) {
			m->state[i] = state[i];
			continue;
		}
		if (posix_memalign(&m->state[i], ALIGN, n ? n : 1) != 0) {
			m->state[i] = NULL;
			return KILN_ENOMEM;
		}
		memcpy(m->state[i], d->state[i].init, n);
	}
	return KILN_OK;
}

/* Every STATE buffer holds exactly its state tensor's elements. */
static kiln_status check_state_sizes(rt_model *m)
{
	const rt_model_desc *d = m->d;
	if (!d->nstate)
		return KILN_OK;
	for (uint32_t s = 0; s < d->nsym; s++)
		m->sym[s] = 1;
	d->numel(m->sym, m->numel);
	for (uint32_t b = 0; b < d->nbuf; b++) {
		const rt_buf_desc *bd = &d->bufs[b];
		if (bd->kind == RT_BUF_STATE && (size_t)m->numel[b] * dtypes[bd->dtype].size !=
		                                        state_bytes(&d->state[bd->slot]))
			return fail(m, KILN_EINVAL, "model '%s': buffer %u does not fit state '%s'",
			            d->name, b, d->state[bd->slot].name);
	}
	memset(m->sym, 0, (d->nsym + 1) * sizeof *m->sym);
	return KILN_OK;
}

kiln_status rt_model_create(const rt_model_desc *d, rt_model **out)
{
	return rt_model_create_shared(d, NULL, out);
}

kiln_status rt_model_create_shared(const rt_model_desc *d, void *const *state, rt_model **out)
{
	char msg[256];
	if (!out)
		return KILN_EINVAL;
	*out = NULL;
	kiln_status st = rt_model_validate(d, msg, sizeof msg);
	if (st != KILN_OK)
		return st;
	rt_model *m = calloc(1, sizeof *m);
	if (!m)
		return KILN_ENOMEM;
	m->d = d;
	m->nthreads = 1;
	st = alloc_tables(m);
	if (st == KILN_OK)
		st = attach_state(m, state);
	if (st == KILN_OK)
		st = check_state_sizes(m);
	if (st == KILN_OK)
		st = plan_aliases(m);
	if (st == KILN_OK)
		st = alloc_scratch(&m->scratch, d->scratch_floats);
	if (st == KILN_OK)
		st = rt_model_set_threads(m, 0);
	if (st != KILN_OK) {
		rt_model_destroy(m);
		return st;
	}
	*out = m;
	return KILN_OK;
}

void rt_model_destroy(rt_model *m)
{
	if (!m)
		return;
	rt_pool_free(m->pool);
	free(m->scratch);
	free(m->buf);
	free(m->home);
	free(m->io_of);
	free(m->numel);
	free(m->pre);
	free(m->post);
	free(m->sym);
	free(m->bound_by);
	free(m->dims);
	free(m->dim_off);
	free(m->slot_off);
	free(m->cbuf);
	free(m->csym);
	free(m->cnumel);
	free(m->tbuf);
	free(m->tsym);
	free(m->toff);
	free(m->tslot);
	free(m->arena);
	for (uint32_t i = 0; m->state && m->own_state && i < m->d->nstate; i++)
		free(m->state[i]);
	free(m->state);
	free(m);
}

/* KILN_NUM_THREADS, when it is a number in [1, MAX_THREADS]; else 1. */
static int env_threads(void)
{
	const char *s = getenv("KILN_NUM_THREADS");
	char *end;
	long n = s ? strtol(s, &end, 10) : 0;
	return s && *s && !*end && n >= 1 && n <= MAX_THREADS ? (int)n : 1;
}

void rt_model_set_profile(rt_model *m, uint64_t *ns)
{
	if (m)
		m->prof = ns;
}

kiln_status rt_model_set_threads(rt_model *m, int n)
{
	if (!m)
		return KILN_EINVAL;
	if (n < 0 || n > MAX_THREADS)
		return fail(m, KILN_EINVAL, "model '%s': thread count %d is not in [0, %d]",
		            m->d->name, n, MAX_THREADS);
	if (n == 0)
		n = env_threads();
	if (n == m->nthreads)
		return KILN_OK;
	rt_pool_free(m->pool);
	m->pool = NULL;
	m->nthreads = 1;
	free(m->tbuf);
	free(m->tsym);
	m->tbuf = NULL;
	m->tsym = NULL;
	if (n > 1) {
		kiln_status st = rt_pool_new(n, m->d->scratch_floats, &m->pool);
		if (st != KILN_OK)
			return fail(m, st, "model '%s': cannot start %d threads", m->d->name, n);
		if (m->nchunk) {
			m->tbuf = calloc((size_t)n * (m->d->nbuf + 1), sizeof *m->tbuf);
			m->tsym = calloc((size_t)n * (m->d->nsym + 1), sizeof *m->tsym);
			if (!m->tbuf || !m->tsym) {
				rt_pool_free(m->pool);
				m->pool = NULL;
				return fail(m, KILN_ENOMEM, "model '%s': out of memory for %d threads",
				            m->d->name, n);
			}
		}
		m->nthreads = n;
	}
	return KILN_OK;
}

const char *rt_model_errmsg(const rt_model *m)
{
	return m ? m->err : "no model (NULL)";
}

size_t rt_model_arena_bytes(const rt_model *m)
{
	return m ? m->arena_bytes : 0;
}

int rt_model_threads(const rt_model *m)
{
	return m ? m->nthreads : 1;
}

/* ---- messages -------------------------------------------------------------- */

/* Signature i's type: "f32[N,784]" (symbolic), or with concrete true the
 * dims the bound symbols give, "f32[2,784]". */
static const char *sig_str(const rt_model *m, uint32_t i, bool concrete, char *buf, size_t size)
{
	const rt_io_desc *io = io_at(m->d, i);
	size_t n = snprintf(buf, size, "%s[", dt_name(io->dtype));
	for (int k = 0; k < io->rank && n < size; k++) {
		const char *sep = k ? "," : "";
		if (concrete)
			n += snprintf(buf + n, size - n, "%s%lld", sep, (long long)m->dims[m->dim_off[i] + k]);
		else if (io->dim_kind[k] == RT_DIM_FIXED)
			n += snprintf(buf + n, size - n, "%s%lld", sep, (long long)io->dims[k]);
		else if (io->dim_kind[k] == RT_DIM_SYM)
			n += snprintf(buf + n, size - n, "%s%s", sep, m->d->sym_names[io->dims[k]]);
		else
			n += snprintf(buf + n, size - n, "%s?", sep);
	}
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

static const char *tensor_str(const kiln_tensor *t, char *buf, size_t size)
{
	size_t n = snprintf(buf, size, "%s[", dtype_ok(t->dtype) ? dt_name(t->dtype) : "?");
	for (int k = 0; k < t->rank && k < KILN_MAX_RANK && n < size; k++)
		n += snprintf(buf + n, size - n, "%s%lld", k ? "," : "", (long long)t->shape[k]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

/* "N = 2, S = 7": the bound symbols. */
static const char *syms_str(const rt_model *m, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = 0;
	for (uint32_t s = 0; s < m->d->nsym && n < size; s++)
		n += snprintf(buf + n, size - n, "%s%s = %lld", s ? ", " : "", m->d->sym_names[s],
		              (long long)m->sym[s]);
	return buf;
}

/* "input 'x': expected f32[N,4] (f32[2,4] for N = 2), got f32[2,5]" */
static kiln_status mismatch(rt_model *m, uint32_t i, bool bound, const kiln_tensor *t)
{
	char want[256], conc[256], got[256], syms[256];
	sig_str(m, i, false, want, sizeof want);
	tensor_str(t, got, sizeof got);
	if (!bound || !m->d->nsym)
		return fail(m, KILN_ESHAPE, "%s '%s': expected %s, got %s", io_kind(m->d, i),
		            io_at(m->d, i)->name, want, got);
	return fail(m, KILN_ESHAPE, "%s '%s': expected %s (%s for %s), got %s", io_kind(m->d, i),
	            io_at(m->d, i)->name, want, sig_str(m, i, true, conc, sizeof conc),
	            syms_str(m, syms, sizeof syms), got);
}

/* ---- binding and checking ---------------------------------------------------- */

/* The largest size a symbol may be bound to: the compiler's IR_DIM_MAX, so
 * that sizes computed from a few symbols cannot overflow. */
#define RT_SYM_MAX ((int64_t)1 << 48)

/* One input: dtype, rank and fixed dims; binds or checks its symbols. */
static kiln_status bind_input(rt_model *m, uint32_t i, const kiln_tensor *t)
{
	const rt_io_desc *io = &m->d->inputs[i];
	char got[256];
	if (t->dtype != io->dtype || t->rank != io->rank)
		return mismatch(m, i, false, t);
	for (int k = 0; k < io->rank; k++) {
		int64_t v = t->shape[k], want = io->dims[k];
		if (io->dim_kind[k] == RT_DIM_FIXED && v != want)
			return mismatch(m, i, false, t);
		if (io->dim_kind[k] != RT_DIM_SYM)
			continue;
		const char *sym = m->d->sym_names[want];
		if (v == 0)
			return fail(m, KILN_EINVAL, "input '%s': batch %s = 0 (got %s); sizes must be at least 1",
			            io->name, sym, tensor_str(t, got, sizeof got));
		if (v < 0)
			return mismatch(m, i, false, t);
		if (v > RT_SYM_MAX) /* only an empty tensor gets here */
			return fail(m, KILN_EINVAL, "input '%s': %s = %lld (got %s); sizes must be in "
			            "[1, 2^48]", io->name, sym, (long long)v, tensor_str(t, got, sizeof got));
		if (m->sym[want] == 0) {
			m->sym[want] = v;
			m->bound_by[want] = (int32_t)i;
		} else if (m->sym[want] != v) {
			char sig[256];
			return fail(m, KILN_ESHAPE,
			            "input '%s': expected %s with %s = %lld (from input '%s'), got %s",
			            io->name, sig_str(m, i, false, sig, sizeof sig), sym,
			            (long long)m->sym[want], m->d->inputs[m->bound_by[want]].name,
			            tensor_str(t, got, sizeof got));
		}
	}
	return KILN_OK;
}

/* Every dim of every input and output for the bound symbols; all must be
 * sizes whose byte counts fit in memory. */
static kiln_status fill_dims(rt_model *m)
{
	const rt_model_desc *d = m->d;
	char sig[256], syms[256];
	if (d->io_dims)
		d->io_dims(m->sym, m->dims);
	for (uint32_t i = 0; i < nio(d); i++) {
		const rt_io_desc *io = io_at(d, i);
		int64_t *dims = m->dims + m->dim_off[i];
		size_t bytes = dtypes[io->dtype].size;
		bool ok = true;
		for (int k = 0; k < io->rank; k++) {
			if (io->dim_kind[k] == RT_DIM_FIXED)
				dims[k] = io->dims[k];
			else if (io->dim_kind[k] == RT_DIM_SYM)
				dims[k] = m->sym[io->dims[k]];
			ok = ok && dims[k] >= 0 &&
			     !__builtin_mul_overflow(bytes, (size_t)dims[k], &bytes) &&
			     bytes <= PTRDIFF_MAX;
		}
		if (!ok)
			return fail(m, KILN_EINVAL, "%s '%s': %s is not a valid size (%s) for %s",
			            io_kind(d, i), io->name, sig_str(m, i, false, sig, sizeof sig),
			            sig_str(m, i, true, syms, sizeof syms), syms_str(m, syms, sizeof syms));
	}
	return KILN_OK;
}

static bool same_dims(const rt_model *m, uint32_t i, const kiln_tensor *t)
{
	const rt_io_desc *io = io_at(m->d, i);
	if (t->dtype != io->dtype || t->rank != io->rank)
		return false;
	for (int k = 0; k < io->rank; k++)
		if (t->shape[k] != m->dims[m->dim_off[i] + k])
			return false;
	return true;
}

/* Binds the symbols from the inputs and checks every input completely. */
static kiln_status bind(rt_model *m, const kiln_tensor *const *in, int nin)
{
	const rt_model_desc *d = m->d;
	m->err[0] = 0;
	if (nin < 0 || (uint32_t)nin != d->ninputs)
		return fail(m, KILN_EINVAL, "model '%s' takes %u input(s), got %d", d->name,
		            d->ninputs, nin);
	if (d->ninputs && !in)
		return fail(m, KILN_EINVAL, "model '%s': inputs is NULL", d->name);
	memset(m->sym, 0, (d->nsym + 1) * sizeof *m->sym);
	for (uint32_t i = 0; i < d->ninputs; i++) {
		if (!in[i] || !in[i]->data)
			return fail(m, KILN_EINVAL, "input %u ('%s') is NULL%s", i, d->inputs[i].name,
			            in[i] ? " (no data)" : "");
		kiln_status st = bind_input(m, i, in[i]);
		if (st != KILN_OK)
			return st;
	}
	for (uint32_t s = 0; s < d->nsym; s++)
		if (!m->sym[s])
			return fail(m, KILN_EINVAL, "model '%s': symbol %s is not bound by any input's shape",
			            d->name, d->sym_names[s]);
	kiln_status st = fill_dims(m);
	for (uint32_t i = 0; st == KILN_OK && i < d->ninputs; i++)
		if (!same_dims(m, i, in[i])) /* only EXPR dims can still differ */
			st = mismatch(m, i, true, in[i]);
	return st;
}

static kiln_status check_outputs(rt_model *m, kiln_tensor *const *out, int nout)
{
	const rt_model_desc *d = m->d;
	if (nout < 0 || (uint32_t)nout != d->noutputs)
		return fail(m, KILN_EINVAL, "model '%s' has %u output(s), got %d", d->name,
		            d->noutputs, nout);
	if (d->noutputs && !out)
		return fail(m, KILN_EINVAL, "model '%s': outputs is NULL", d->name);
	for (uint32_t i = 0; i < d->noutputs; i++) {
		if (!out[i] || !out[i]->data)
			return fail(m, KILN_EINVAL, "output %u ('%s') is NULL%s", i, d->outputs[i].name,
			            out[i] ? " (no data)" : "");
		if (!same_dims(m, d->ninputs + i, out[i]))
			return mismatch(m, d->ninputs + i, true, out[i]);
	}
	return KILN_OK;
}

/* ---- running ------------------------------------------------------------------ */

/* Whether run c executes chunk by chunk for the bound symbols. */
static bool chunked(const rt_model *m, const rt_chunk_desc *c)
{
	return m->sym[c->sym] > c->chunk;
}

/* Element counts for the symbols, then slot offsets; grows the arena. */
static kiln_status plan_arena(rt_model *m)
{
	const rt_model_desc *d = m->d;
	char syms[256];
	size_t total = 0;
	d->numel(m->sym, m->numel);
	memset(m->slot_off, 0, (d->nslot + 1) * sizeof *m->slot_off);
	for (uint32_t b = 0; b < d->nbuf; b++) {
		size_t bytes;
		if (m->numel[b] < 0 ||
		    __builtin_mul_overflow((size_t)m->numel[b], dtypes[d->bufs[b].dtype].size, &bytes) ||
		    bytes > PTRDIFF_MAX - ALIGN)
			return fail(m, KILN_ENOMEM, "model '%s': buffer %u is too large for %s", d->name,
			            b, syms_str(m, syms, sizeof syms));
		int32_t s = d->bufs[b].slot;
		if (d->bufs[b].kind == RT_BUF_TEMP && s >= 0 && bytes > m->slot_off[s] &&
		    !(m->nchunk && d->chunk_of[b] >= 0 && chunked(m, &d->chunks[d->chunk_of[b]])))
			m->slot_off[s] = bytes;
	}
	/* a buffer internal to a run that will be chunked holds one chunk */
	for (uint32_t r = 0; r < m->nchunk; r++) {
		const rt_chunk_desc *c = &d->chunks[r];
		if (!chunked(m, c))
			continue;
		memcpy(m->csym, m->sym, d->nsym * sizeof *m->csym);
		m->csym[c->sym] = c->chunk;
		d->numel(m->csym, m->cnumel);
		for (uint32_t b = 0; b < d->nbuf; b++) {
			int32_t s = d->bufs[b].slot;
			size_t bytes;
			if (d->chunk_of[b] != (int32_t)r || d->bufs[b].kind != RT_BUF_TEMP || s < 0)
				continue;
			if (m->cnumel[b] < 0 || m->cnumel[b] > m->numel[b])
				m->cnumel[b] = m->numel[b]; /* never more than the whole batch's */
			bytes = (size_t)m->cnumel[b] * dtypes[d->bufs[b].dtype].size;
			if (bytes > m->slot_off[s])
				m->slot_off[s] = bytes;
		}
	}
	for (uint32_t s = 0; s < d->nslot; s++) {
		size_t size = (m->slot_off[s] + ALIGN - 1) / ALIGN * ALIGN;
		m->slot_off[s] = total;
		if (__builtin_add_overflow(total, size, &total) || total > PTRDIFF_MAX)
			return fail(m, KILN_ENOMEM, "model '%s': scratch too large for %s", d->name,
			            syms_str(m, syms, sizeof syms));
	}
	/* threads 1.. get their own copy of each chunked run's internal buffers */
	m->treg = total;
	m->treg_bytes = 0;
	for (uint32_t r = 0; m->tbuf && r < m->nchunk; r++) {
		const rt_chunk_desc *c = &d->chunks[r];
		size_t off = 0;
		if (!chunked(m, c))
			continue;
		memset(m->tslot, 0, d->nslot * sizeof *m->tslot);
		memcpy(m->csym, m->sym, d->nsym * sizeof *m->csym);
		m->csym[c->sym] = c->chunk;
		d->numel(m->csym, m->cnumel);
		for (uint32_t b = 0; b < d->nbuf; b++) {
			int32_t s = d->bufs[b].slot;
			if (d->chunk_of[b] != (int32_t)r || d->bufs[b].kind != RT_BUF_TEMP || s < 0)
				continue;
			int64_t ne = m->cnumel[b] < 0 || m->cnumel[b] > m->numel[b] ? m->numel[b]
			                                                          : m->cnumel[b];
			size_t bytes = (size_t)ne * dtypes[d->bufs[b].dtype].size;
			if (bytes + 1 > m->tslot[s])
				m->tslot[s] = bytes + 1; /* + 1: used, even when empty */
		}
		for (uint32_t s = 0; s < d->nslot; s++)
			if (m->tslot[s]) {
				size_t size = (m->tslot[s] - 1 + ALIGN - 1) / ALIGN * ALIGN;
				m->tslot[s] = off;
				off += size;
			}
		for (uint32_t b = 0; b < d->nbuf; b++)
			if (d->chunk_of[b] == (int32_t)r && d->bufs[b].kind == RT_BUF_TEMP &&
			    d->bufs[b].slot >= 0)
				m->toff[b] = m->tslot[d->bufs[b].slot];
		if (off > m->treg_bytes)
			m->treg_bytes = off;
	}
	size_t tall;
	if (__builtin_mul_overflow(m->treg_bytes, (size_t)(m->nthreads - 1), &tall) ||
	    __builtin_add_overflow(total, tall, &total) || total > PTRDIFF_MAX)
		return fail(m, KILN_ENOMEM, "model '%s': scratch too large for %s", d->name,
		            syms_str(m, syms, sizeof syms));
	if (total <= m->arena_bytes)
		return KILN_OK;
	free(m->arena);
	m->arena = NULL;
	m->arena_bytes = 0;
	/* an arena of HUGE_PAGE bytes or more in whole 2 MB pages where the kernel
	 * has them (transparent huge pages: "madvise" mode gives none unless
	 * asked) */
	size_t align = ALIGN;
	if (total >= HUGE_PAGE && total <= PTRDIFF_MAX - HUGE_PAGE) {
		align = HUGE_PAGE;
		total = (total + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
	}
	if (posix_memalign(&m->arena, align, total) != 0) {
		m->arena = NULL;
		return fail(m, KILN_ENOMEM, "model '%s': cannot allocate %zu bytes of scratch for %s",
		            d->name, total, syms_str(m, syms, sizeof syms));
	}
#ifdef MADV_HUGEPAGE
	if (align == HUGE_PAGE)
		madvise(m->arena, total, MADV_HUGEPAGE); /* a hint: failure changes nothing */
#endif
	m->arena_bytes = total;
	return KILN_OK;
}

/* A buffer's own pointer, before aliases are applied. */
static void *own_ptr(const rt_model *m, int32_t b, const void *const *in, void *const *out)
{
	const rt_buf_desc *bd = &m->d->bufs[b];
	switch (bd->kind) {
	case RT_BUF_INPUT: return (void *)in[m->io_of[b]];
	case RT_BUF_OUTPUT: return out[m->io_of[b]];
	case RT_BUF_CONST: return (void *)bd->data;
	case RT_BUF_STATE: return m->state[bd->slot];
	default: return bd->slot >= 0 && m->arena ? (char *)m->arena + m->slot_off[bd->slot] : NULL;
	}
}

static void copy_buf(const rt_model *m, void *to, int32_t tb, const void *from)
{
	size_t n = (size_t)m->numel[tb] * dtypes[m->d->bufs[tb].dtype].size;
	if (n && to != from)
		memcpy(to, from, n);
}

/* Kernel k's wall time into the profile, when one is kept (threads running
 * chunks add to it concurrently). */
static void prof_add(rt_model *m, uint32_t k, const struct timespec *t0)
{
	struct timespec t1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	__atomic_fetch_add(&m->prof[k], (uint64_t)((t1.tv_sec - t0->tv_sec) * 1000000000LL +
	                                           (t1.tv_nsec - t0->tv_nsec)),
	                   __ATOMIC_RELAXED);
}

/* The run's error for a fault kernel k reported. */
static kiln_status fault_fail(rt_model *m, uint32_t k, const rt_fault *fault)
{
	const rt_model_desc *d = m->d;
	const char *what = fault->what ? fault->what : "index";
	const char *kn = d->kernel_names && d->kernel_names[k] ? d->kernel_names[k] : "?";
	if (fault->lo >= fault->hi)
		return fail(m, KILN_EINVAL, "model '%s': %s (kernel %s)", d->name, what, kn);
	return fail(m, KILN_EINVAL, "model '%s': %s %lld out of range [%lld, %lld) "
	            "(kernel %s)", d->name, what, (long long)fault->value,
	            (long long)fault->lo, (long long)fault->hi, kn);
}

/* Runs kernel k; fails the run when one of its checks failed. */
static kiln_status run_kernel(rt_model *m, uint32_t k, rt_exec *x)
{
	struct timespec t0;
	if (m->prof)
		clock_gettime(CLOCK_MONOTONIC, &t0);
	m->d->kernels[k](x);
	if (m->prof)
		prof_add(m, k, &t0);
	if (!atomic_load_explicit(&x->fault->set, memory_order_acquire))
		return KILN_OK;
	return fault_fail(m, k, x->fault);
}

/* Runs c's kernels chunk by chunk: the symbol bound to the chunk's size,
 * each buffer of off[] moved to the chunk's first sample (its numel is the
 * batch times a sample's), the run's internal buffers where they are. */
static kiln_status run_chunked(rt_model *m, const rt_chunk_desc *c, const rt_exec *x)
{
	const rt_model_desc *d = m->d;
	int64_t n = m->sym[c->sym];
	memcpy(m->csym, m->sym, d->nsym * sizeof *m->csym);
	memcpy(m->cbuf, m->buf, d->nbuf * sizeof *m->cbuf);
	rt_exec cx = *x;
	cx.buf = m->cbuf;
	cx.sym = m->csym;
	for (int64_t s0 = 0; s0 < n; s0 += c->chunk) {
		m->csym[c->sym] = n - s0 < c->chunk ? n - s0 : c->chunk;
		for (int32_t i = 0; i < c->noff; i++) {
			int32_t b = c->off[i];
			size_t sample = (size_t)(m->numel[b] / n) * dtypes[d->bufs[b].dtype].size;
			m->cbuf[b] = m->buf[b] ? (char *)m->buf[b] + (size_t)s0 * sample : NULL;
		}
		for (int32_t k = c->first; k <= c->last; k++) {
			kiln_status st = run_kernel(m, (uint32_t)k, &cx);
			if (st != KILN_OK)
				return st;
		}
	}
	return KILN_OK;
}

/* A chunked run spread over the pool: chunk i is samples
 * [n * i / nch, n * (i + 1) / nch), at most c->chunk of them; each thread
 * runs whole chunks, every kernel of the run in turn, with its own copy of
 * the run's internal buffers and no barrier between kernels. */
typedef struct par_job {
	rt_model *m;
	const rt_chunk_desc *c;
	int64_t n, nch;
	_Atomic int stop;         /* a thread faulted: the others stop early */
	rt_fault *fault;          /* per thread */
	int64_t *fchunk;          /* per thread: the faulting chunk, or -1 */
	int32_t *fkern;           /* per thread: its kernel */
} par_job;

static void chunk_range(rt_exec *x, int64_t i0, int64_t i1)
{
	/* the pool hands each thread a copy of the exec it was given, whose buf
	 * carries the job: the kernels get an exec of their own below */
	par_job *j = (par_job *)(void *)x->buf;
	rt_model *m = j->m;
	const rt_model_desc *d = m->d;
	const rt_chunk_desc *c = j->c;
	int t = (int)x->thread;
	void **tb = m->tbuf + (size_t)t * (d->nbuf + 1);
	int64_t *ts = m->tsym + (size_t)t * (d->nsym + 1);
	memcpy(tb, m->buf, d->nbuf * sizeof *tb);
	memcpy(ts, m->sym, d->nsym * sizeof *ts);
	if (t > 0) {
		char *reg = (char *)m->arena + m->treg + (size_t)(t - 1) * m->treg_bytes;
		for (uint32_t b = 0; b < d->nbuf; b++) {
			int32_t h = m->home[b];
			if (d->chunk_of[b] == (int32_t)(c - d->chunks) && h >= 0 &&
			    d->bufs[h].kind == RT_BUF_TEMP)
				tb[b] = d->bufs[h].slot >= 0 ? reg + m->toff[h] : NULL;
		}
	}
	rt_fault *f = &j->fault[t];
	rt_exec cx = *x;
	cx.buf = tb;
	cx.sym = ts;
	cx.pool = NULL;
	cx.fault = f;
	for (int64_t i = i0; i < i1; i++) {
		int64_t s0 = j->n * i / j->nch, s1 = j->n * (i + 1) / j->nch;
		if (atomic_load_explicit(&j->stop, memory_order_relaxed))
			return;
		ts[c->sym] = s1 - s0;
		for (int32_t o = 0; o < c->noff; o++) {
			int32_t b = c->off[o];
			size_t sample = (size_t)(m->numel[b] / j->n) * dtypes[d->bufs[b].dtype].size;
			tb[b] = m->buf[b] ? (char *)m->buf[b] + (size_t)s0 * sample : NULL;
		}
		for (int32_t k = c->first; k <= c->last; k++) {
			struct timespec t0;
			if (m->prof)
				clock_gettime(CLOCK_MONOTONIC, &t0);
			d->kernels[k](&cx);
			if (m->prof)
				prof_add(m, (uint32_t)k, &t0);
			if (atomic_load_explicit(&f->set, memory_order_acquire)) {
				j->fchunk[t] = i;
				j->fkern[t] = k;
				atomic_store_explicit(&j->stop, 1, memory_order_relaxed);
				return;
			}
		}
	}
}

static kiln_status run_chunked_par(rt_model *m, const rt_chunk_desc *c, const rt_exec *x)
{
	int nt = m->nthreads;
	int64_t n = m->sym[c->sym];
	rt_fault fault[MAX_THREADS];
	int64_t fchunk[MAX_THREADS];
	int32_t fkern[MAX_THREADS];
	/* as many chunks as c->chunk allows, rounded up to a multiple of the
	 * threads so each gets the same number of samples, give or take one */
	int64_t nch = (n + c->chunk - 1) / c->chunk;
	nch = (nch + nt - 1) / nt * nt;
	if (nch > n)
		nch = n;
	par_job j = {.m = m, .c = c, .n = n, .nch = nch, .fault = fault, .fchunk = fchunk,
	             .fkern = fkern};
	for (int t = 0; t < nt; t++) {
		fault[t] = (rt_fault){0};
		fchunk[t] = -1;
	}
	rt_exec px = *x;
	px.buf = (void **)(void *)&j;
	rt_parallel_for(&px, nch, chunk_range);
	int first = -1;
	for (int t = 0; t < nt; t++)
		if (fchunk[t] >= 0 && (first < 0 || fchunk[t] < fchunk[first]))
			first = t;
	return first < 0 ? KILN_OK : fault_fail(m, (uint32_t)fkern[first], &fault[first]);
}

static kiln_status execute_hooked(rt_model *m, const void *const *in, void *const *out,
                                  rt_kernel_hook hook, void *ud)
{
	const rt_model_desc *d = m->d;
	kiln_status st = plan_arena(m);
	if (st != KILN_OK)
		return st;
	for (uint32_t b = 0; b < d->nbuf; b++)
		m->buf[b] = own_ptr(m, (int32_t)b, in, out);
	for (int k = 0; k < m->npre; k++)
		copy_buf(m, m->buf[m->pre[k].to], m->pre[k].to, m->buf[m->pre[k].from]);
	for (uint32_t b = 0; b < d->nbuf; b++)
		m->buf[b] = m->buf[m->home[b]];
	rt_fault fault = {0};
	rt_exec x = {.buf = m->buf, .sym = m->sym, .pool = m->pool, .scratch = m->scratch,
	             .fault = &fault};
	uint32_t r = 0;
	for (uint32_t k = 0; k < d->nkern;) {
		while (r < m->nchunk && (uint32_t)d->chunks[r].last < k)
			r++;
		const rt_chunk_desc *c = r < m->nchunk ? &d->chunks[r] : NULL;
		/* a hook sees every kernel in order: no chunking under one (only
		 * training steps have hooks, and their programs are never chunked) */
		if (!hook && c && (uint32_t)c->first == k && chunked(m, c)) {
			st = m->tbuf && m->pool ? run_chunked_par(m, c, &x) : run_chunked(m, c, &x);
			if (st != KILN_OK)
				return st;
			k = (uint32_t)c->last + 1;
			continue;
		}
		st = run_kernel(m, k, &x);
		if (st != KILN_OK)
			return st;
		if (hook && (st = hook(ud, m, k)) != KILN_OK)
			return st;
		k++;
	}
	for (int k = 0; k < m->npost; k++)
		copy_buf(m, own_ptr(m, m->post[k].to, in, out), m->post[k].to,
		         m->buf[m->post[k].from]);
	return KILN_OK;
}

void *rt_model_buf(const rt_model *m, int32_t b)
{
	return m && b >= 0 && (uint32_t)b < m->d->nbuf ? m->buf[b] : NULL;
}

kiln_status rt_model_set_error(rt_model *m, kiln_status code, const char *msg)
{
	return m ? fail(m, code, "%s", msg) : code;
}

void rt_out_of_range(rt_exec *x, const char *what, int64_t value, int64_t lo, int64_t hi)
{
	int32_t unset = 0;
	if (!x || !x->fault ||
	    !atomic_compare_exchange_strong_explicit(&x->fault->set, &unset, 1,
	                                             memory_order_acq_rel, memory_order_relaxed))
		return;
	x->fault->what = what;
	x->fault->value = value;
	x->fault->lo = lo;
	x->fault->hi = hi;
}

kiln_status rt_model_run(rt_model *m, const int64_t *syms, const void *const *in,
                         void *const *out)
{
	return rt_model_run_hooked(m, syms, in, out, NULL, NULL);
}

kiln_status rt_model_run_hooked(rt_model *m, const int64_t *syms, const void *const *in,
                                void *const *out, rt_kernel_hook hook, void *ud)
{
	if (!m)
		return KILN_EINVAL;
	const rt_model_desc *d = m->d;
	m->err[0] = 0;
	if (d->nsym && !syms)
		return fail(m, KILN_EINVAL, "model '%s': syms is NULL (it has %u symbol(s), %s first)",
		            d->name, d->nsym, d->sym_names[0]);
	if ((d->ninputs && !in) || (d->noutputs && !out))
		return fail(m, KILN_EINVAL, "model '%s': %s is NULL", d->name, !in ? "in" : "out");
	for (uint32_t i = 0; i < nio(d); i++)
		if (!(i < d->ninputs ? in[i] : out[i - d->ninputs]))
			return fail(m, KILN_EINVAL, "%s '%s' is NULL", io_kind(d, i), io_at(d, i)->name);
	for (uint32_t s = 0; s < d->nsym; s++) {
		if (syms[s] == 0)
			return fail(m, KILN_EINVAL, "model '%s': batch %s = 0; sizes must be at least 1",
			            d->name, d->sym_names[s]);
		if (syms[s] < 0 || syms[s] > RT_SYM_MAX)
			return fail(m, KILN_EINVAL, "model '%s': %s = %lld; sizes must be in [1, 2^48]",
			            d->name, d->sym_names[s], (long long)syms[s]);
		m->sym[s] = syms[s];
	}
	kiln_status st = fill_dims(m);
	return st == KILN_OK ? execute_hooked(m, in, out, hook, ud) : st;
}

kiln_status rt_model_run_tensors(rt_model *m, const kiln_tensor *const *in, int nin,
                                 kiln_tensor *const *out, int nout)
{
	return rt_model_run_tensors_hooked(m, in, nin, out, nout, NULL, NULL);
}

kiln_status rt_model_run_tensors_hooked(rt_model *m, const kiln_tensor *const *in, int nin,
                                        kiln_tensor *const *out, int nout, rt_kernel_hook hook,
                                        void *ud)
{
	if (!m)
		return KILN_EINVAL;
	kiln_status st = bind(m, in, nin);
	if (st == KILN_OK)
		st = check_outputs(m, out, nout);
	if (st != KILN_OK)
		return st;
	const void *ip[nin + 1];
	void *op[nout + 1];
	for (int i = 0; i < nin; i++)
		ip[i] = in[i]->data;
	for (int i = 0; i < nout; i++)
		op[i] = out[i]->data;
	return execute_hooked(m, ip, op, hook, ud);
}

kiln_status rt_model_output_shape(rt_model *m, const kiln_tensor *const *in, int nin, int i,
                                  int *rank, int64_t *dims)
{
	if (!m)
		return KILN_EINVAL;
	kiln_status st = bind(m, in, nin);
	if (st != KILN_OK)
		return st;
	if (i < 0 || (uint32_t)i >= m->d->noutputs || !rank || !dims)
		return fail(m, KILN_EINVAL, "model '%s': no output %d (it has %u)", m->d->name, i,
		            m->d->noutputs);
	*rank = m->d->outputs[i].rank;
	memcpy(dims, m->dims + m->dim_off[m->d->ninputs + i], *rank * sizeof *dims);
	return KILN_OK;
}
