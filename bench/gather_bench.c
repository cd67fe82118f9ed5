/*
 * gather_bench.c: what checking Gather's indices costs a compiled library.
 *
 * Each model is lowered once and emitted twice, as kiln_compile does it:
 * with its CG_CHECK statements (what kiln_compile emits) and with them
 * turned into empty blocks (the clamp-only kernels kiln emitted before the
 * checks).  Both libraries are loaded with kiln_load and timed alternately
 * on the same random in-range indices, best of several rounds of this
 * thread's CPU time (so other processes on a shared machine cannot inflate
 * them), one thread.
 *
 *   embed64:  Embedding(100000, 64) on i64[256, 64] indices, mean over the
 *             bag: one check per copied 64-float row
 *   gather64: the same lookup alone, output [256, 64, 64]
 *   lookup1:  a 1-D table f32[100000] gathered at 1M i64 indices: one
 *             check per copied float, the worst case
 *
 *   cmake --build build --target gather_bench && build/gather_bench [rounds]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/backend.h"
#include "codegen/lower.h"
#include "kiln/kiln.h"
#include "passes/passes.h"

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *msg)
{
	fprintf(stderr, "gather_bench: %s: %s\n", what, msg);
	exit(1);
}

static int strip(cg_stmt *s)
{
	int n = 0;
	if (!s)
		return 0;
	if (s->kind == CG_CHECK) {
		*s = (cg_stmt){.kind = CG_BLOCK};
		return 1;
	}
	for (int i = 0; s->kind == CG_BLOCK && i < s->n; i++)
		n += strip(s->items[i]);
	return n + strip(s->body) + strip(s->then_s) + strip(s->else_s);
}

/* g lowered as kiln_compile lowers it, emitted to path (checks kept or
 * stripped), loaded. */
static kiln_model *build(const kiln_graph *g, const char *path, bool checks)
{
	kiln_error e = {0};
	kiln_graph *c = ir_graph_clone(g);
	cg_module *m = NULL;
	if (kiln_graph_optimize(c, PASS_INFERENCE, &e) ||
	    cg_lower_ex(c, &(cg_lower_opts){.fuse = true}, &m, &e) || cg_memplan(m, &e))
		die("lowering", e.msg);
	int n = 0;
	for (int k = 0; !checks && k < m->nkern; k++)
		n += strip(m->kern[k].body);
	if (!checks && n == 0)
		die(path, "no check to strip");
	if (cg_emit(NULL, m, path, &(kiln_compile_opts){0}, "bench", &e))
		die("emit", e.msg);
	cg_module_free(m);
	kiln_graph_free(c);
	kiln_model *lib = NULL;
	if (kiln_load(path, &lib, &e))
		die("load", e.msg);
	return lib;
}

static double time_run(kiln_model *m, kiln_tensor *in, kiln_tensor *out, int reps)
{
	kiln_error e = {0};
	double t0 = cpu_now();
	for (int r = 0; r < reps; r++)
		if (kiln_model_run_into(m, &in, 1, &out, 1, &e))
			die("run", e.msg);
	return (cpu_now() - t0) / reps;
}

static void bench(const char *name, kiln_graph *g, kiln_tensor *idx, int rounds)
{
	char dir[] = "/tmp/kiln_gather_bench.XXXXXX", a[256], b[256];
	if (!mkdtemp(dir))
		die("mkdtemp", "failed");
	snprintf(a, sizeof a, "%s/checked.so", dir);
	snprintf(b, sizeof b, "%s/clamped.so", dir);
	kiln_model *mc = build(g, a, true), *mu = build(g, b, false);
	kiln_tensor *out = NULL;
	kiln_error e = {0};
	if (kiln_model_run(mc, &idx, 1, &out, 1, &e)) /* allocates out */
		die("run", e.msg);
	time_run(mu, idx, out, 1); /* both warm */
	double one = time_run(mc, idx, out, 1);
	int reps = one > 0.05 ? 1 : (int)(0.05 / (one + 1e-9)) + 1;
	double best[2] = {1e9, 1e9};
	for (int r = 0; r < rounds; r++) {
		double t = time_run(mc, idx, out, reps), u = time_run(mu, idx, out, reps);
		best[0] = t < best[0] ? t : best[0];
		best[1] = u < best[1] ? u : best[1];
	}
	printf("%-9s checked %9.1f us   clamp only %9.1f us   cost %+6.2f%%\n", name,
	       best[0] * 1e6, best[1] * 1e6, (best[0] / best[1] - 1) * 100);
	kiln_tensor_free(out);
	kiln_model_free(mc), kiln_model_free(mu);
	unlink(a), unlink(b);
	char h[300];
	snprintf(h, sizeof h, "%s/checked.h", dir), unlink(h);
	snprintf(h, sizeof h, "%s/clamped.h", dir), unlink(h);
	snprintf(h, sizeof h, "%s/bench.h", dir), unlink(h);
	rmdir(dir);
}

static kiln_tensor *indices(int rank, const int64_t *shape, int64_t hi)
{
	kiln_tensor *t = kiln_tensor_new(KILN_I64, rank, shape);
	uint64_t s = 42;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++) {
		s = s * 6364136223846793005u + 1442695040888963407u;
		((int64_t *)t->data)[i] = (int64_t)((s >> 33) % (uint64_t)hi);
	}
	return t;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 15;
	const int64_t V = 100000, D = 64, bag[2] = {256, 64}, flat[1] = {1 << 20};
	kiln_tensor *ib = indices(2, bag, V), *iflat = indices(1, flat, V);
	for (int k = 0; k < 2; k++) {
		kiln_graph *g = kiln_graph_new(k ? "gather64" : "embed64");
		kiln_graph_seed(g, 1);
		kiln_value x = kiln_input(g, "idx", KILN_I64, 2, bag);
		kiln_value y = kiln_embedding(g, "emb", x, V, D);
		if (!k)
			y = kiln_reduce_mean(g, y, 1, (int64_t[]){1}, false);
		kiln_output(g, "y", y);
		if (kiln_graph_status(g))
			die("graph", kiln_graph_errmsg(g));
		bench(kiln_graph_name(g), g, ib, rounds);
		kiln_graph_free(g);
	}
	kiln_graph *g = kiln_graph_new("lookup1");
	kiln_tensor *table = kiln_tensor_new(KILN_F32, 1, &V);
	for (int64_t i = 0; i < V; i++)
		((float *)table->data)[i] = (float)i;
	kiln_value t = kiln_param(g, "table", table);
	kiln_output(g, "y", kiln_gather(g, t, kiln_input(g, "idx", KILN_I64, 1, flat), 0));
	if (kiln_graph_status(g))
		die("graph", kiln_graph_errmsg(g));
	bench("lookup1", g, iflat, rounds);
	kiln_graph_free(g);
	kiln_tensor_free(table), kiln_tensor_free(ib), kiln_tensor_free(iflat);
	return 0;
}
