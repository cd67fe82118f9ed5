/*
 * test_chunk.c: batch-chunked execution (codegen/chunk.c, runtime/model.c).
 *
 * A small MobileNet-like network over a symbolic batch N (conv, depthwise
 * conv, 1x1 conv with a residual Add, pools, a Linear) is compiled with
 * chunking forced (KILN_CHUNK=2 and 3) and off (KILN_CHUNK=0); the chunked
 * library must carry chunked runs (its kiln_model_desc, read with dlsym) and
 * give the unchunked one's outputs within 1e-6 at batches that are not a
 * multiple of the chunk (5, 7, 16), that fit in one chunk (1, 2), at 1, 2
 * and 3 threads (chunks spread over the threads).  At kernel-IR level, cg_chunk's cost model: a small cache
 * chunks, a large one does not; a per-sample-breaking node (Softmax over
 * the batch axis) ends a run; a fixed batch is never chunked; a buffer
 * internal to a run is marked and one crossing its edge is offset.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "codegen/codegen.h"
#include "kiln/kiln.h"
#include "runtime/model.h"
#include "tmpdir.h"

/* A deterministic parameter of the given shape, values in [-s, s). */
static kiln_value param(kiln_graph *g, const char *name, int rank, const int64_t *shape,
                        double s)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, shape);
	ck_assert_ptr_nonnull(t);
	float *p = t->data;
	uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)strlen(name) * 977;
	for (const char *c = name; *c; c++)
		x = x * 31 + (uint64_t)*c;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = (float)(((double)(x >> 11) / 9007199254740992.0 * 2 - 1) * s);
	}
	kiln_value v = kiln_param(g, name, t);
	kiln_tensor_free(t);
	return v;
}

static kiln_value conv(kiln_graph *g, const char *name, kiln_value x, int64_t cin,
                       int64_t cout, int64_t k, int64_t stride, int64_t group)
{
	char wn[64], bn[64];
	snprintf(wn, sizeof wn, "%s.w", name);
	snprintf(bn, sizeof bn, "%s.b", name);
	kiln_value w = param(g, wn, 4, (int64_t[]){cout, cin / group, k, k}, 1.0 / sqrt((double)(cin / group * k * k)));
	kiln_value b = param(g, bn, 1, (int64_t[]){cout}, 0.1);
	kiln_conv_opts o = {.kernel = {k, k}, .stride = {stride, stride},
	                    .pad = {k / 2, k / 2, k / 2, k / 2}, .group = group};
	return kiln_conv(g, x, w, b, &o);
}

/* x: f32[N,4,24,24] -> f32[N,10]; softmax0: a Softmax over the batch axis
 * after the second block (not per-sample). */
static kiln_graph *net(bool symbolic, bool softmax0)
{
	kiln_graph *g = kiln_graph_new("chunknet");
	int64_t N = symbolic ? kiln_sym(g, "N") : 4;
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){N, 4, 24, 24});
	kiln_value h = kiln_relu(g, conv(g, "c0", x, 4, 16, 3, 1, 1));
	kiln_value e = kiln_clip(g, conv(g, "e1", h, 16, 48, 1, 1, 1), 0, 6);
	e = kiln_clip(g, conv(g, "d1", e, 48, 48, 3, 1, 48), 0, 6);
	h = kiln_add(g, h, conv(g, "p1", e, 48, 16, 1, 1, 1));
	if (softmax0)
		h = kiln_softmax(g, h, 0);
	e = kiln_clip(g, conv(g, "e2", h, 16, 48, 1, 1, 1), 0, 6);
	e = kiln_clip(g, conv(g, "d2", e, 48, 48, 3, 2, 48), 0, 6);
	h = kiln_max_pool(g, conv(g, "p2", e, 48, 24, 1, 1, 1),
	                  &(kiln_conv_opts){.kernel = {2, 2}, .stride = {2, 2}});
	h = kiln_global_avg_pool(g, kiln_relu(g, conv(g, "c3", h, 24, 32, 3, 1, 1)));
	h = kiln_flatten(g, h, 1);
	kiln_value w = param(g, "fc.w", 2, (int64_t[]){10, 32}, 0.2);
	kiln_value b = param(g, "fc.b", 1, (int64_t[]){10}, 0.1);
	kiln_output(g, "y", kiln_gemm(g, h, w, b, 1.0, 1.0, false, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

/* Compiles g with $KILN_CHUNK = chunk ("" : unset) into tpath(file),
 * returned in path (tpath's own buffers are reused after two calls). */
static const char *compile(const kiln_graph *g, const char *chunk, const char *file,
                           char *path)
{
	if (*chunk)
		setenv("KILN_CHUNK", chunk, 1);
	else
		unsetenv("KILN_CHUNK");
	kiln_error err = {0};
	snprintf(path, 256, "%s", tpath(file));
	kiln_status st = kiln_compile(g, path, &(kiln_compile_opts){.name = "chunknet"}, &err);
	unsetenv("KILN_CHUNK");
	ck_assert_msg(st == KILN_OK, "compile: %s", err.msg);
	return path;
}

/* The library's chunked runs, read from its description. */
static uint32_t nchunk(const char *so, int *min_kernels)
{
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "dlopen: %s", dlerror());
	const rt_model_desc *d = dlsym(h, "kiln_model_desc");
	ck_assert_ptr_nonnull(d);
	ck_assert_int_eq(d->abi, RT_MODEL_ABI);
	uint32_t n = d->nchunk;
	*min_kernels = 1 << 30;
	for (uint32_t r = 0; r < n; r++) {
		int len = d->chunks[r].last - d->chunks[r].first + 1;
		*min_kernels = len < *min_kernels ? len : *min_kernels;
	}
	dlclose(h);
	return n;
}

static kiln_tensor *run(const char *so, int64_t batch, int threads)
{
	kiln_model *m = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_load(so, &m, &err) == KILN_OK, "load: %s", err.msg);
	ck_assert_int_eq(kiln_model_set_threads(m, threads, &err), KILN_OK);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 4, (int64_t[]){batch, 4, 24, 24});
	float *p = x->data;
	for (int64_t i = 0; i < kiln_tensor_numel(x); i++)
		p[i] = (float)sin((double)i * 0.37 + (double)batch);
	kiln_tensor *y = NULL;
	kiln_status st = kiln_model_run(m, &x, 1, &y, 1, &err);
	ck_assert_msg(st == KILN_OK, "run: %s", err.msg);
	/* a second run in the same context: the chunk-sized scratch is reused */
	kiln_tensor *y2 = NULL;
	ck_assert_int_eq(kiln_model_run(m, &x, 1, &y2, 1, &err), KILN_OK);
	ck_assert(memcmp(y->data, y2->data, kiln_tensor_nbytes(y)) == 0);
	kiln_tensor_free(y2);
	kiln_tensor_free(x);
	kiln_model_free(m);
	return y;
}

static double max_diff(const kiln_tensor *a, const kiln_tensor *b)
{
	ck_assert_int_eq(kiln_tensor_numel(a), kiln_tensor_numel(b));
	const float *x = a->data, *y = b->data;
	double worst = 0;
	for (int64_t i = 0; i < kiln_tensor_numel(a); i++) {
		double d = fabs((double)x[i] - y[i]);
		worst = d > worst || d != d ? (d != d ? INFINITY : d) : worst;
	}
	return worst;
}

START_TEST(chunked_equals_unchunked)
{
	tmp_make("kiln_chunk");
	kiln_graph *g = net(true, false);
	char p0[256], p2[256], p3[256];
	const char *off = compile(g, "0", "off.so", p0);
	const char *on2 = compile(g, "2", "on2.so", p2);
	const char *on3 = compile(g, "3", "on3.so", p3);
	int len;
	ck_assert_uint_eq(nchunk(off, &len), 0);
	ck_assert_uint_ge(nchunk(on2, &len), 1);
	ck_assert_int_ge(len, 2);
	ck_assert_uint_ge(nchunk(on3, &len), 1);
	/* at 2 and 3 threads a chunked run is spread over the threads, each
	 * with its own copy of the run's internal buffers (batch 2 at 3
	 * threads: fewer chunks than threads; 7: uneven chunks) */
	const int64_t batches[] = {1, 2, 5, 7, 16};
	for (int t = 1; t <= 3; t++)
		for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
			kiln_tensor *ref = run(off, batches[i], t);
			const char *ons[] = {on2, on3};
			double scale = 0;
			for (int64_t j = 0; j < kiln_tensor_numel(ref); j++)
				scale = fmax(scale, fabs(((float *)ref->data)[j]));
			ck_assert_msg(scale > 1e-3, "outputs all near 0: the test would prove nothing");
			for (int k = 0; k < 2; k++) {
				kiln_tensor *y = run(ons[k], batches[i], t);
				double d = max_diff(ref, y);
				ck_assert_msg(d <= 1e-6, "chunk %d, batch %lld, %d threads: max |diff| %g",
				              k + 2, (long long)batches[i], t, d);
				kiln_tensor_free(y);
			}
			kiln_tensor_free(ref);
		}
	kiln_graph_free(g);
	tmp_remove();
}
END_TEST

/* The graph lowered as kiln_compile lowers it, before cg_memplan. */
static cg_module *lowered(kiln_graph *g, kiln_graph **gc)
{
	kiln_error err = {0};
	*gc = ir_graph_clone(g);
	ck_assert_ptr_nonnull(*gc);
	ck_assert_int_eq(kiln_graph_optimize(*gc, NULL, &err), KILN_OK);
	cg_module *m = NULL;
	ck_assert_msg(cg_lower(*gc, &m, &err) == KILN_OK, "%s", err.msg);
	return m;
}

static cg_module *chunked(kiln_graph *g, kiln_graph **gc, cg_chunk_opts o)
{
	kiln_error err = {0};
	cg_module *m = lowered(g, gc);
	ck_assert_int_eq(cg_chunk(m, &o, &err), KILN_OK);
	ck_assert_int_eq(cg_memplan(m, &err), KILN_OK);
	return m;
}

START_TEST(cost_model)
{
	kiln_graph *g = net(true, false), *gc;
	/* a 16 KiB cache: the 24x24 layers (tens of KiB per sample) chunk */
	cg_module *m = chunked(g, &gc, (cg_chunk_opts){.cache_bytes = 16 << 10});
	ck_assert_int_ge(m->nchunk, 1);
	int internal = 0;
	for (int r = 0; r < m->nchunk; r++) {
		const cg_chunk_run *c = &m->chunk[r];
		ck_assert_int_ge(c->last, c->first + 1);
		ck_assert_int_ge(c->chunk, 1);
		ck_assert_int_ge(c->noff, 1);
		for (int i = 0; i < c->noff; i++) { /* offset buffers: sample-major, not internal */
			const cg_buf *b = &m->buf[c->off[i]];
			ck_assert_int_eq(b->chunk, -1);
			ck_assert_ptr_nonnull(b->dim[0]);
			ck_assert_int_eq(b->dim[0]->kind, CG_SIZE);
		}
		for (int b = 0; b < m->nbuf; b++)
			if (m->buf[b].chunk == r) {
				internal++;
				/* lives inside the run; every other buffer it touches spans it */
				ck_assert_int_eq(m->buf[b].kind, CG_BUF_TEMP);
				ck_assert_int_ge(m->buf[b].first, c->first);
				ck_assert_int_le(m->buf[b].last, c->last);
			}
	}
	ck_assert_int_ge(internal, 1);
	cg_module_free(m);
	kiln_graph_free(gc);
	/* a 1 GiB cache: the whole batch fits, nothing to chunk */
	m = chunked(g, &gc, (cg_chunk_opts){.cache_bytes = (int64_t)1 << 30});
	ck_assert_int_eq(m->nchunk, 0);
	cg_module_free(m);
	kiln_graph_free(gc);
	/* off */
	m = chunked(g, &gc, (cg_chunk_opts){.force = -1, .cache_bytes = 16 << 10});
	ck_assert_int_eq(m->nchunk, 0);
	for (int b = 0; b < m->nbuf; b++)
		ck_assert_int_eq(m->buf[b].chunk, -1);
	cg_module_free(m);
	kiln_graph_free(gc);
	kiln_graph_free(g);
}
END_TEST

/* Linears of 96 -> 256 -> 256 -> 96 (96 KiB, 256 KiB, 96 KiB of weights,
 * 1.4-2 KiB of activations a sample) over a symbolic batch. */
static kiln_graph *mlp(void)
{
	kiln_graph *g = kiln_graph_new("chunkmlp");
	int64_t N = kiln_sym(g, "N"), d[] = {96, 256, 256, 96};
	kiln_value h = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, d[0]});
	for (int i = 0; i < 3; i++) {
		char wn[16], bn[16];
		snprintf(wn, sizeof wn, "l%d.w", i);
		snprintf(bn, sizeof bn, "l%d.b", i);
		kiln_value w = param(g, wn, 2, (int64_t[]){d[i + 1], d[i]}, 0.1);
		kiln_value b = param(g, bn, 1, (int64_t[]){d[i + 1]}, 0.1);
		h = kiln_relu(g, kiln_gemm(g, h, w, b, 1.0, 1.0, false, true));
	}
	kiln_output(g, "y", h);
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

/* Every chunk reads a kernel's weights again: with a 64 KiB cache every
 * Linear's weights (96-256 KiB) leave no room, so each would take chunks of
 * one sample (1.4-2 KiB), reading its weights once per sample instead of
 * once per batch: not chunked.  Forced, the same Linears do chunk: the rule
 * is what keeps them whole. */
START_TEST(weights_larger_than_chunk_not_chunked)
{
	kiln_graph *g = mlp(), *gc;
	cg_module *m = chunked(g, &gc, (cg_chunk_opts){.cache_bytes = 64 << 10});
	ck_assert_int_eq(m->nchunk, 0);
	cg_module_free(m);
	kiln_graph_free(gc);
	m = chunked(g, &gc, (cg_chunk_opts){.force = 2, .cache_bytes = 64 << 10});
	ck_assert_int_ge(m->nchunk, 1);
	cg_module_free(m);
	kiln_graph_free(gc);
	kiln_graph_free(g);
}
END_TEST

/* A Softmax over the batch axis mixes samples: no run may hold it. */
START_TEST(batch_axis_ends_run)
{
	kiln_graph *g = net(true, true), *gc;
	cg_module *m = chunked(g, &gc, (cg_chunk_opts){.force = 2});
	ck_assert_int_ge(m->nchunk, 1);
	int softmax = -1;
	for (int k = 0; k < m->nkern; k++)
		if (strstr(m->kern[k].name, "softmax"))
			softmax = k;
	ck_assert_int_ge(softmax, 0);
	for (int r = 0; r < m->nchunk; r++)
		ck_assert_msg(softmax < m->chunk[r].first || softmax > m->chunk[r].last,
		              "run %d (%d..%d) holds the batch-axis softmax %d", r, m->chunk[r].first,
		              m->chunk[r].last, softmax);
	cg_module_free(m);
	kiln_graph_free(gc);
	kiln_graph_free(g);
}
END_TEST

/* A fixed batch has no symbol to bind to a chunk's size. */
START_TEST(fixed_batch_not_chunked)
{
	kiln_graph *g = net(false, false), *gc;
	cg_module *m = chunked(g, &gc, (cg_chunk_opts){.force = 2});
	ck_assert_int_eq(m->nchunk, 0);
	cg_module_free(m);
	kiln_graph_free(gc);
	kiln_graph_free(g);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("chunk");
	TCase *tc = tcase_create("chunk");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, chunked_equals_unchunked);
	tcase_add_test(tc, cost_model);
	tcase_add_test(tc, weights_larger_than_chunk_not_chunked);
	tcase_add_test(tc, batch_axis_ends_run);
	tcase_add_test(tc, fixed_batch_not_chunked);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(suite)
