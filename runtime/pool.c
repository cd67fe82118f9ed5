/*
 * pool.c: the thread pool behind rt_parallel_for.
 *
 * A pool belongs to one rt_model (no global state): nthreads - 1 workers
 * plus the calling thread, which always runs chunk 0.  A parallel loop
 * splits [0, n) statically into one contiguous chunk per thread (never
 * smaller than MIN_GRAIN iterations), publishes the job by bumping a
 * generation counter, runs its own chunk and waits for the others.
 *
 * The key idea is that chunks are claimed, not assigned.  A job is one
 * atomic ticket (generation, chunk count, next chunk); the caller takes
 * chunk 0 and then, like every worker, claims chunks with a CAS until none
 * is left, and waits only for chunks that were claimed and are still
 * running.  So a worker that is asleep or descheduled (this machine has two
 * cores shared with compilers) never stalls a loop: the caller runs its
 * chunk, and a late worker finds the ticket of a finished generation and
 * touches nothing.  A model run is a burst of parallel loops microseconds
 * apart and a condvar wake-up costs about as much as a small loop, so an
 * idle worker first spins on the ticket for SPIN_NS and only then sleeps on
 * the condvar; between runs the workers are asleep and cost nothing.  The
 * job's fields are written before the ticket's release store and read only
 * after a successful claim (acquire), and the next job is written only
 * after every claimed chunk is done, so the pool is clean under TSan.
 *
 * Each chunk gets its own copy of the caller's rt_exec with the thread's
 * index, its own GEMM scratch (allocated once, here) and pool = NULL, so a
 * parallel loop nested in a chunk runs inline.  The copy is needed anyway:
 * generated code and the driver of a loaded library are separate copies of
 * this file, and a field of the exec is the only state both can see.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"
#include "runtime/model.h"

enum {
	MIN_GRAIN = 1,       /* iterations per chunk: loops are outer loops */
	SPIN_NS = 200000,    /* how long an idle worker polls before sleeping */
	MAX_THREADS = 256,
};

typedef struct worker {
	rt_pool *pool;
	int index;
	pthread_t tid;
} worker;

struct rt_pool {
	int nthreads;
	worker *w;            /* [1, nthreads): index 0 is the caller */
	float **scratch;      /* per thread; [0] is unused (the caller's own) */
	pthread_mutex_t mu;
	pthread_cond_t wake;
	/* the current job: generation << 32 | chunks << 16 | next chunk */
	atomic_uint_fast64_t ticket;
	atomic_int done;           /* chunks finished by workers */
	atomic_int busy;           /* a job is in flight: nested callers go inline */
	atomic_int sleepers;       /* workers blocked (or about to block) on wake */
	atomic_bool quit;
	uint32_t gen;              /* the caller's last generation */
	/* the current job's loop: written before the ticket is published */
	rt_exec job;
	rt_range_fn fn;
	int64_t n;
	int nchunks;
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Chunk c of nc over [0, n): sizes differ by at most one. */
static void run_chunk(rt_pool *p, int c, rt_exec *x)
{
	int64_t b = p->n * c / p->nchunks, e = p->n * (c + 1) / p->nchunks;
	if (b < e)
		p->fn(x, b, e);
}

/* Takes the next chunk of generation gen, if it has one left. */
static bool claim(rt_pool *p, uint32_t gen, int *chunk)
{
	uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
	for (;;) {
		int nc = (int)(t >> 16 & 0xffff), next = (int)(t & 0xffff);
		if ((uint32_t)(t >> 32) != gen || next >= nc)
			return false;
		if (atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
		                                          memory_order_acquire)) {
			*chunk = next;
			return true;
		}
	}
}

/* Waits for a generation other than seen: spin first, then sleep. */
static uint32_t await_job(rt_pool *p, uint32_t seen)
{
	uint32_t g;
	int64_t deadline = 0;
	for (unsigned i = 1;; i++) {
		if ((g = (uint32_t)(atomic_load_explicit(&p->ticket, memory_order_acquire) >> 32)) !=
		        seen ||
		    atomic_load_explicit(&p->quit, memory_order_acquire))
			return g;
		cpu_relax();
		if (i % 256)
			continue;
		if (!deadline)
			deadline = now_ns() + SPIN_NS;
		else if (now_ns() > deadline)
			break;
	}
	/* sleepers, then gen (both seq_cst), against the caller's gen, then
	 * sleepers: one of the two sides sees the other's write, so either we
	 * see the new job here or the caller broadcasts under mu. */
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add(&p->sleepers, 1);
	while ((g = (uint32_t)(atomic_load(&p->ticket) >> 32)) == seen && !atomic_load(&p->quit))
		pthread_cond_wait(&p->wake, &p->mu);
	atomic_fetch_sub(&p->sleepers, 1);
	pthread_mutex_unlock(&p->mu);
	return g;
}

static void *worker_main(void *arg)
{
	worker *w = arg;
	rt_pool *p = w->pool;
	uint32_t seen = 0;
	int c;
	for (;;) {
		seen = await_job(p, seen);
		if (atomic_load_explicit(&p->quit, memory_order_acquire))
			return NULL;
		while (claim(p, seen, &c)) {
			rt_exec x = p->job;
			x.pool = NULL;
			x.scratch = p->scratch[w->index];
			x.thread = w->index;
			run_chunk(p, c, &x);
			atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
		}
	}
}

/* Publishes a job of nc chunks; chunk 0 is the caller's already. */
static uint32_t publish(rt_pool *p, const rt_exec *x, int64_t n, int nc, rt_range_fn fn)
{
	p->nchunks = nc;
	p->job = *x;
	p->fn = fn;
	p->n = n;
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	uint32_t gen = ++p->gen;
	atomic_store(&p->ticket, (uint64_t)gen << 32 | (uint64_t)nc << 16 | 1);
	if (atomic_load(&p->sleepers)) { /* spinning workers need no syscall */
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->wake);
		pthread_mutex_unlock(&p->mu);
	}
	return gen;
}

void rt_parallel_for(rt_exec *x, int64_t n, rt_range_fn fn)
{
	rt_pool *p = x->pool;
	int64_t nc = n / MIN_GRAIN;
	int expect = 0, c, mine = 1;
	rt_exec self = *x;
	self.pool = NULL; /* loops nested in this one run inline */
	if (n <= 0)
		return;
	if (!p || nc < 2) {
		/* one chunk: the pool stays free for loops nested in it (a conv's
		 * per-image GEMM loop at batch 1 splits the GEMM's columns) */
		fn(x, 0, n);
		return;
	}
	if (!atomic_compare_exchange_strong(&p->busy, &expect, 1)) {
		fn(&self, 0, n);
		return;
	}
	uint32_t gen = publish(p, x, n, nc < p->nthreads ? (int)nc : p->nthreads, fn);
	run_chunk(p, 0, &self);
	for (; claim(p, gen, &c); mine++)
		run_chunk(p, c, &self);
	/* only chunks a worker claimed and still runs are waited for */
	for (unsigned i = 1; atomic_load_explicit(&p->done, memory_order_acquire) + mine < p->nchunks;
	     i++) {
		cpu_relax();
		if (i % 4096 == 0)
			sched_yield();
	}
	atomic_store_explicit(&p->busy, 0, memory_order_release);
}

/* Stops and joins the first n workers; frees everything. */
static void pool_free(rt_pool *p, int started)
{
	pthread_mutex_lock(&p->mu);
	atomic_store_explicit(&p->quit, true, memory_order_release);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i <= started; i++)
		pthread_join(p->w[i].tid, NULL);
	for (int i = 1; i < p->nthreads; i++)
		free(p->scratch[i]);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->mu);
	free(p->scratch);
	free(p->w);
	free(p);
}

void rt_pool_free(rt_pool *p)
{
	if (p)
		pool_free(p, p->nthreads - 1);
}

static kiln_status alloc_scratch(rt_pool *p, uint64_t floats)
{
	if (floats > SIZE_MAX / 8)
		return KILN_ENOMEM;
	size_t bytes = (size_t)((floats * sizeof(float) + 63) / 64 * 64);
	for (int i = 1; i < p->nthreads; i++)
		if (bytes && posix_memalign((void **)&p->scratch[i], 64, bytes) != 0)
			return KILN_ENOMEM;
	return KILN_OK;
}

kiln_status rt_pool_new(int nthreads, uint64_t scratch_floats, rt_pool **out)
{
	*out = NULL;
	if (nthreads < 2 || nthreads > MAX_THREADS)
		return KILN_EINVAL;
	rt_pool *p = calloc(1, sizeof *p);
	if (!p)
		return KILN_ENOMEM;
	p->nthreads = nthreads;
	p->w = calloc(nthreads, sizeof *p->w);
	p->scratch = calloc(nthreads, sizeof *p->scratch);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	kiln_status st = p->w && p->scratch ? alloc_scratch(p, scratch_floats) : KILN_ENOMEM;
	int started = 0;
	for (int i = 1; st == KILN_OK && i < nthreads; i++, started++) {
		p->w[i] = (worker){.pool = p, .index = i};
		if (pthread_create(&p->w[i].tid, NULL, worker_main, &p->w[i]) != 0)
			st = KILN_ENOMEM;
	}
	if (st != KILN_OK) {
		if (!p->w || !p->scratch)
			p->nthreads = 1; /* nothing was allocated per thread */
		pool_free(p, started);
		return st;
	}
	*out = p;
	return KILN_OK;
}

int rt_pool_threads(const rt_pool *p)
{
	return p ? p->nthreads : 1;
}
