/*
 * comm_mpi.c: kiln_comm over MPI (libkiln_mpi, built only where CMake finds
 * MPI): in-place all-reduce (MPI_Iallreduce per gradient bucket), broadcast,
 * barrier, on MPI_COMM_WORLD.
 *
 * The key idea is that no wait ever blocks inside MPI: every collective is
 * started non-blocking and polled (MPI_Testall) against a deadline, so a
 * rank that died or hangs turns into an error on the others within the
 * timeout instead of a job that never ends.  To say which rank, each wait
 * also exchanges a heartbeat with every peer (a tiny message per collective
 * and peer, sent once this rank has reached the wait): when the deadline
 * passes, the peers whose heartbeat has not arrived are the ones that never
 * got there.  A peer can also stop inside a wait (after its heartbeat went
 * out): so every wait answers probes while it polls, and on timeout each
 * rank probes its peers and waits a little for the answers; a peer without
 * a heartbeat or an answer is named.  The caller then calls abandon, not
 * close: a peer that never arrives would keep MPI_Finalize waiting too, so
 * the rank frees what is its own and leaves MPI as it is; its process exits
 * with an error, and the launcher (mpirun) ends the other ranks.  Nothing
 * here ends the process.
 */
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

enum { MAXREQ = 4096, HB_TAG = 7117, PROBE_TAG = 7118, REPLY_TAG = 7119 };

typedef struct pending {
	void *buf;
	int64_t n;
	kiln_dtype dt;
} pending;

typedef struct mpi_comm {
	kiln_comm c;
	double timeout;
	bool inited;           /* we called MPI_Init_thread: we finalize */
	MPI_Request req[MAXREQ];
	pending pend[MAXREQ];
	int npend;
	int64_t seq;           /* collectives so far: the heartbeat's payload */
	int64_t *hb_in;        /* per peer: its heartbeat */
	MPI_Request *hb_req;   /* 2 per peer: receive, send */
	char err[1024];
} mpi_comm;

static kiln_status fail(mpi_comm *m, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static kiln_status fail(mpi_comm *m, kiln_status code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = snprintf(m->err, sizeof m->err, "rank %d of %d: ", m->c.rank, m->c.size);
	vsnprintf(m->err + n, sizeof m->err - (size_t)n, fmt, ap);
	va_end(ap);
	return code;
}

static kiln_status mpi_fail(mpi_comm *m, int rc, const char *what)
{
	char s[MPI_MAX_ERROR_STRING];
	int len = 0;
	MPI_Error_string(rc, s, &len);
	return fail(m, KILN_EIO, "%s: %.*s", what, len, s);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool mpi_type(kiln_dtype dt, MPI_Datatype *t)
{
	switch (dt) {
	case KILN_F32: *t = MPI_FLOAT; return true;
	case KILN_F64: *t = MPI_DOUBLE; return true;
	case KILN_I64: *t = MPI_INT64_T; return true;
	case KILN_I32: *t = MPI_INT32_T; return true;
	default: return false;
	}
}

/* Answers every probe a peer has sent (a wait that polls is alive). */
static void answer_probes(mpi_comm *m)
{
	int flag = 1;
	while (flag) {
		MPI_Status st;
		if (MPI_Iprobe(MPI_ANY_SOURCE, PROBE_TAG, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS)
			return;
		if (!flag)
			return;
		int64_t v;
		MPI_Recv(&v, 1, MPI_INT64_T, st.MPI_SOURCE, PROBE_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		MPI_Send(&v, 1, MPI_INT64_T, st.MPI_SOURCE, REPLY_TAG, MPI_COMM_WORLD);
	}
}

/* After a timeout: which peers answer a probe within a few seconds.
 * alive[p] is set for each that does. */
static void probe_peers(mpi_comm *m, uint8_t *alive)
{
	int k = m->c.size, me = m->c.rank, n = 0;
	int64_t out = m->seq, *in = calloc((size_t)k, sizeof *in);
	MPI_Request *r = calloc(2 * (size_t)k, sizeof *r);
	if (!in || !r) {
		free(in), free(r);
		return;
	}
	for (int p = 0; p < k; p++) {
		if (p == me)
			continue;
		MPI_Irecv(&in[p], 1, MPI_INT64_T, p, REPLY_TAG, MPI_COMM_WORLD, &r[n++]);
		MPI_Isend(&out, 1, MPI_INT64_T, p, PROBE_TAG, MPI_COMM_WORLD, &r[n++]);
	}
	double grace = m->timeout < 3 ? m->timeout : 3, end = now() + grace;
	while (now() < end) {
		answer_probes(m);
		int all = 0;
		MPI_Testall(n, r, &all, MPI_STATUSES_IGNORE);
		if (all)
			break;
		sched_yield();
	}
	for (int p = 0, i = 0; p < k; p++) {
		if (p == me)
			continue;
		int got = 0;
		MPI_Test(&r[i], &got, MPI_STATUS_IGNORE);
		alive[p] = (uint8_t)got;
		i += 2;
	}
	free(in), free(r);
}

/* Polls reqs[0..n) and the heartbeats until all are done or the deadline;
 * on timeout, names the peers whose heartbeat never came or that do not
 * answer a probe. */
static kiln_status finish(mpi_comm *m, MPI_Request *reqs, int n, const char *what, int64_t step)
{
	int k = m->c.size, me = m->c.rank, nh = 0;
	int64_t beat = ++m->seq;
	for (int p = 0; p < k; p++) {
		if (p == me)
			continue;
		MPI_Irecv(&m->hb_in[p], 1, MPI_INT64_T, p, HB_TAG, MPI_COMM_WORLD, &m->hb_req[nh++]);
		MPI_Isend(&beat, 1, MPI_INT64_T, p, HB_TAG, MPI_COMM_WORLD, &m->hb_req[nh++]);
	}
	double deadline = now() + m->timeout;
	int done = 0, hb_done = 0, rc;
	while (!done || !hb_done) {
		if (!done && (rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE)) != MPI_SUCCESS)
			return mpi_fail(m, rc, what);
		if (!hb_done && (rc = MPI_Testall(nh, m->hb_req, &hb_done, MPI_STATUSES_IGNORE)) !=
		                        MPI_SUCCESS)
			return mpi_fail(m, rc, what);
		if (done && hb_done)
			break;
		if (now() > deadline)
			break;
		answer_probes(m);
		sched_yield();
	}
	if (done && hb_done)
		return KILN_OK;
	char who[512] = "";
	size_t len = 0;
	uint8_t *alive = calloc((size_t)k, 1);
	if (alive)
		probe_peers(m, alive);
	for (int p = 0, h = 0; p < k; p++) {
		if (p == me)
			continue;
		int got = 0;
		MPI_Test(&m->hb_req[h], &got, MPI_STATUS_IGNORE);
		h += 2;
		if ((!got || (alive && !alive[p])) && len < sizeof who - 16)
			len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", p);
	}
	free(alive);
	if (len)
		return fail(m, KILN_EIO, "%s of step %lld did not finish within %g s: no word from rank%s "
		            "%s (dead or hung)", what, (long long)step, m->timeout,
		            strchr(who, ',') ? "s" : "", who);
	return fail(m, KILN_EIO, "%s of step %lld did not finish within %g s although every rank "
	            "reached it", what, (long long)step, m->timeout);
}

static kiln_status start(kiln_comm *c, void *buf, int64_t n, kiln_dtype dt)
{
	mpi_comm *m = (mpi_comm *)c;
	MPI_Datatype t;
	if (!mpi_type(dt, &t) || n < 0 || n > 0x7fffffff)
		return fail(m, KILN_EINVAL, "all-reduce of %lld elements of %s: unsupported",
		            (long long)n, kiln_dtype_name(dt));
	if (m->npend == MAXREQ)
		return fail(m, KILN_EINVAL, "more than %d all-reduces in flight", MAXREQ);
	int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, t, MPI_SUM, MPI_COMM_WORLD,
	                        &m->req[m->npend]);
	if (rc != MPI_SUCCESS)
		return mpi_fail(m, rc, "MPI_Iallreduce");
	m->pend[m->npend++] = (pending){buf, n, dt};
	return KILN_OK;
}

static void scale(const pending *p, double s)
{
	if (p->dt == KILN_F32)
		for (int64_t i = 0; i < p->n; i++)
			((float *)p->buf)[i] = (float)(((float *)p->buf)[i] * s);
	else if (p->dt == KILN_F64)
		for (int64_t i = 0; i < p->n; i++)
			((double *)p->buf)[i] *= s;
}

/* Means are sums divided by the size (f32 in f64, then rounded once). */
static kiln_status wait_all(kiln_comm *c, int64_t step)
{
	mpi_comm *m = (mpi_comm *)c;
	kiln_status st = finish(m, m->req, m->npend, "gradient all-reduce", step);
	for (int i = 0; st == KILN_OK && i < m->npend; i++)
		scale(&m->pend[i], 1.0 / c->size);
	m->npend = 0;
	return st;
}

static kiln_status sum(kiln_comm *c, void *buf, int64_t n, kiln_dtype dt)
{
	mpi_comm *m = (mpi_comm *)c;
	MPI_Datatype t;
	MPI_Request r;
	if (!mpi_type(dt, &t) || n < 0 || n > 0x7fffffff)
		return fail(m, KILN_EINVAL, "all-reduce of %lld elements of %s: unsupported",
		            (long long)n, kiln_dtype_name(dt));
	int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, t, MPI_SUM, MPI_COMM_WORLD, &r);
	return rc != MPI_SUCCESS ? mpi_fail(m, rc, "MPI_Iallreduce")
	                         : finish(m, &r, 1, "all-reduce", c->step);
}

static kiln_status mean(kiln_comm *c, void *buf, int64_t n, kiln_dtype dt)
{
	kiln_status st = sum(c, buf, n, dt);
	if (st == KILN_OK)
		scale(&(pending){buf, n, dt}, 1.0 / c->size);
	return st;
}

static kiln_status bcast(kiln_comm *c, void *buf, int64_t bytes, int root)
{
	mpi_comm *m = (mpi_comm *)c;
	MPI_Request r;
	if (bytes < 0 || bytes > 0x7fffffff || root < 0 || root >= c->size)
		return fail(m, KILN_EINVAL, "broadcast of %lld bytes from rank %d: unsupported",
		            (long long)bytes, root);
	int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &r);
	return rc != MPI_SUCCESS ? mpi_fail(m, rc, "MPI_Ibcast")
	                         : finish(m, &r, 1, "broadcast", c->step);
}

static kiln_status barrier(kiln_comm *c)
{
	mpi_comm *m = (mpi_comm *)c;
	MPI_Request r;
	int rc = MPI_Ibarrier(MPI_COMM_WORLD, &r);
	return rc != MPI_SUCCESS ? mpi_fail(m, rc, "MPI_Ibarrier")
	                         : finish(m, &r, 1, "barrier", c->step);
}

static const char *errmsg(const kiln_comm *c)
{
	return ((const mpi_comm *)c)->err;
}

/* close, less MPI_Finalize (collective: a hung peer never lets it end).
 * Requests still in flight are left to MPI, whose buffers they name; the
 * process is expected to exit soon after. */
static void mpi_abandon(kiln_comm *c)
{
	mpi_comm *m = (mpi_comm *)c;
	if (!m)
		return;
	free(m->hb_in), free(m->hb_req);
	free(m);
}

static void mpi_close(kiln_comm *c)
{
	mpi_comm *m = (mpi_comm *)c;
	if (!m)
		return;
	if (m->inited)
		MPI_Finalize();
	free(m->hb_in), free(m->hb_req);
	free(m);
}

KILN_API kiln_status kiln_comm_mpi_open(int *argc, char ***argv, double timeout_s,
                                        kiln_comm **out, kiln_error *err)
{
	if (!out || !(timeout_s > 0)) {
		if (err)
			snprintf(err->msg, sizeof err->msg, "kiln_comm_mpi_open: %s",
			         !out ? "out is NULL" : "the timeout must be > 0 seconds");
		return err ? (err->code = KILN_EINVAL) : KILN_EINVAL;
	}
	*out = NULL;
	mpi_comm *m = calloc(1, sizeof *m);
	if (!m)
		return KILN_ENOMEM;
	int flag = 0, provided;
	MPI_Initialized(&flag);
	if (!flag) {
		if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
			free(m);
			if (err)
				snprintf(err->msg, sizeof err->msg, "kiln_comm_mpi_open: MPI_Init_thread failed");
			return err ? (err->code = KILN_EIO) : KILN_EIO;
		}
		m->inited = true;
	}
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &m->c.rank);
	MPI_Comm_size(MPI_COMM_WORLD, &m->c.size);
	m->timeout = timeout_s;
	m->hb_in = calloc((size_t)m->c.size, sizeof *m->hb_in);
	m->hb_req = calloc(2 * (size_t)m->c.size, sizeof *m->hb_req);
	m->c.allreduce_mean_start = start;
	m->c.wait = wait_all;
	m->c.allreduce_sum = sum;
	m->c.allreduce_mean = mean;
	m->c.broadcast = bcast;
	m->c.barrier = barrier;
	m->c.errmsg = errmsg;
	m->c.abandon = mpi_abandon;
	m->c.close = mpi_close;
	if (!m->hb_in || !m->hb_req) {
		mpi_close(&m->c);
		return KILN_ENOMEM;
	}
	*out = &m->c;
	return KILN_OK;
}
