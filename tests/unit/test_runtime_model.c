/*
 * test_runtime_model.c: the generated-library driver (runtime/model.c), the
 * thread pool (pool.c) and kiln_load (loader.c), without the LLVM backend.
 *
 * Models are written by hand in C: tests/fixtures/rt/relu1.c is y =
 * relu(x) + 1 through a TEMP buffer with a symbolic batch, included here to
 * drive its descriptor directly and also linked into relu1.so exactly as
 * `kiln compile` links a model (against the unsanitized runtime archive),
 * for kiln_load, readelf and valgrind.  A second descriptor below, "views",
 * exercises aliases: an output that is a view of an input, a TEMP written
 * straight into an output, a second output of the same bytes, an EXPR dim,
 * and two inputs that share the batch symbol.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "kiln/kiln.h"
#include "runtime/model.h"
#include "runtime/rt.h"
#include "so_util.h"

#include "../fixtures/rt/relu1.c"

/* ---- helpers ----------------------------------------------------------- */

static kiln_tensor *f32(int rank, const int64_t *shape)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, shape);
	ck_assert_ptr_nonnull(t);
	float *p = t->data;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		p[i] = (float)((i * 37) % 11) - 5.0f; /* negatives and positives */
	return t;
}

static kiln_tensor *x_of(int64_t n)
{
	return f32(2, (int64_t[]){n, 4});
}

static void check_relu1(const kiln_tensor *x, const kiln_tensor *y)
{
	const float *a = x->data, *b = y->data;
	ck_assert_int_eq(kiln_tensor_numel(x), kiln_tensor_numel(y));
	for (int64_t i = 0; i < kiln_tensor_numel(x); i++)
		ck_assert_float_eq(b[i], (a[i] > 0 ? a[i] : 0) + 1);
}

static rt_model *make(const rt_model_desc *d)
{
	rt_model *m = NULL;
	ck_assert_int_eq(rt_model_create(d, &m), KILN_OK);
	return m;
}

/* Runs relu1 at batch n through the tensor API and checks y. */
static void run_relu1(rt_model *m, int64_t n)
{
	kiln_tensor *x = x_of(n), *y = kiln_tensor_new(KILN_F32, 2, (int64_t[]){n, 4});
	kiln_status st = rt_model_run_tensors(m, (const kiln_tensor *const[]){x}, 1, &y, 1);
	ck_assert_msg(st == KILN_OK, "%s", rt_model_errmsg(m));
	check_relu1(x, y);
	kiln_tensor_free(x);
	kiln_tensor_free(y);
}

/* Expects run_tensors(in, out) to fail with code and a message containing
 * want. */
static void expect_fail(rt_model *m, kiln_tensor *const *in, int nin, kiln_tensor *const *out,
                        int nout, kiln_status code, const char *want)
{
	kiln_status st = rt_model_run_tensors(m, (const kiln_tensor *const *)in, nin, out, nout);
	ck_assert_int_eq(st, code);
	ck_assert_msg(strstr(rt_model_errmsg(m), want), "message '%s' lacks '%s'",
	              rt_model_errmsg(m), want);
}

/* ---- driver ------------------------------------------------------------- */

START_TEST(relu1_correct_at_several_batches)
{
	rt_model *m = make(&kiln_model_desc);
	for (int64_t n = 1; n <= 9; n += 4)
		run_relu1(m, n);
	run_relu1(m, 2);
	rt_model_destroy(m);
}
END_TEST

START_TEST(arena_grows_only_for_larger_batch)
{
	rt_model *m = make(&kiln_model_desc);
	ck_assert_uint_eq(rt_model_arena_bytes(m), 0); /* nothing before the first run */
	run_relu1(m, 4);  /* 4*4 floats = 64 bytes */
	ck_assert_uint_eq(rt_model_arena_bytes(m), 64);
	run_relu1(m, 2);
	ck_assert_uint_eq(rt_model_arena_bytes(m), 64);
	run_relu1(m, 100); /* 1600 bytes */
	ck_assert_uint_eq(rt_model_arena_bytes(m), 1600);
	run_relu1(m, 5);
	ck_assert_uint_eq(rt_model_arena_bytes(m), 1600);
	rt_model_destroy(m);
}
END_TEST

START_TEST(typed_run_takes_symbols_explicitly)
{
	rt_model *m = make(&kiln_model_desc);
	kiln_tensor *x = x_of(3), *y = kiln_tensor_new(KILN_F32, 2, (int64_t[]){3, 4});
	kiln_status st = rt_model_run(m, (int64_t[]){3}, (const void *const[]){x->data},
	                              (void *const[]){y->data});
	ck_assert_msg(st == KILN_OK, "%s", rt_model_errmsg(m));
	check_relu1(x, y);
	ck_assert_str_eq(rt_model_errmsg(m), "");
	kiln_tensor_free(x);
	kiln_tensor_free(y);
	rt_model_destroy(m);
}
END_TEST

START_TEST(output_shape_follows_batch)
{
	rt_model *m = make(&kiln_model_desc);
	kiln_tensor *x = x_of(7);
	int rank = 0;
	int64_t dims[KILN_MAX_RANK];
	ck_assert_int_eq(rt_model_output_shape(m, (const kiln_tensor *const[]){x}, 1, 0, &rank, dims),
	                 KILN_OK);
	ck_assert_int_eq(rank, 2);
	ck_assert_int_eq(dims[0], 7);
	ck_assert_int_eq(dims[1], 4);
	ck_assert_int_eq(rt_model_output_shape(m, (const kiln_tensor *const[]){x}, 1, 1, &rank, dims),
	                 KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(rt_model_errmsg(m), "no output 1"));
	kiln_tensor_free(x);
	rt_model_destroy(m);
}
END_TEST

/* ---- views: aliases, EXPR dims, two inputs sharing N -------------------- */

static bool views_u_is_y, views_x_is_xc;

static void views_k0(rt_exec *x)
{
	const float *in = x->buf[0];
	float *t = x->buf[2];
	for (int64_t i = 0; i < x->sym[0] * 4; i++)
		t[i] = in[i] > 0 ? in[i] : 0;
	views_x_is_xc = x->buf[0] == x->buf[5];
}

static void views_k1(rt_exec *x)
{
	const float *t = x->buf[2], *z = x->buf[1];
	float *u = x->buf[3];
	for (int64_t i = 0; i < x->sym[0] * 4; i++)
		u[i] = t[i] + z[i / 4];
	views_u_is_y = x->buf[3] == x->buf[4];
}

static void views_numel(const int64_t *sym, int64_t *numel)
{
	for (int b = 0; b < 7; b++)
		numel[b] = sym[0] * 4;
	numel[1] = sym[0];
}

static void views_io_dims(const int64_t *sym, int64_t *d)
{
	int64_t n = sym[0];
	int64_t all[] = {n, 4, n, 4 * n, n, 4, 4 * n};
	memcpy(d, all, sizeof all);
}

static const int64_t v_nc[] = {0, 4}, v_n[] = {0}, v_e[] = {0};
static const int32_t v_sf[] = {RT_DIM_SYM, RT_DIM_FIXED}, v_s[] = {RT_DIM_SYM},
		     v_x[] = {RT_DIM_EXPR};
static const char *const v_syms[] = {"N"};
static const rt_io_desc v_in[] = {
	{"x", KILN_F32, 2, v_nc, v_sf, 0, 0},
	{"z", KILN_F32, 1, v_n, v_s, 1, 0},
};
static const rt_io_desc v_out[] = {
	{"y", KILN_F32, 1, v_e, v_x, 4, 0},
	{"xc", KILN_F32, 2, v_nc, v_sf, 5, 0},
	{"yc", KILN_F32, 1, v_e, v_x, 6, 0},
};
static const rt_buf_desc v_bufs[] = {
	{RT_BUF_INPUT, KILN_F32, -1, -1, NULL},  {RT_BUF_INPUT, KILN_F32, -1, -1, NULL},
	{RT_BUF_TEMP, KILN_F32, 0, -1, NULL},    {RT_BUF_TEMP, KILN_F32, -1, 4, NULL},
	{RT_BUF_OUTPUT, KILN_F32, -1, -1, NULL}, {RT_BUF_OUTPUT, KILN_F32, -1, 0, NULL},
	{RT_BUF_OUTPUT, KILN_F32, -1, 4, NULL},
};
static const rt_kernel_fn v_kernels[] = {views_k0, views_k1};
static const rt_model_desc views = {
	.abi = RT_MODEL_ABI, .nsym = 1, .name = "views", .sym_names = v_syms,
	.ninputs = 2, .noutputs = 3, .inputs = v_in, .outputs = v_out,
	.nbuf = 7, .nslot = 1, .bufs = v_bufs, .nkern = 2, .kernels = v_kernels,
	.numel = views_numel, .io_dims = views_io_dims,
};

typedef struct views_io {
	kiln_tensor *in[2], *out[3];
} views_io;

static views_io views_make(int64_t n)
{
	views_io v = {{x_of(n), f32(1, (int64_t[]){n})},
	              {kiln_tensor_new(KILN_F32, 1, (int64_t[]){4 * n}), x_of(n),
	               kiln_tensor_new(KILN_F32, 1, (int64_t[]){4 * n})}};
	memset(v.out[1]->data, 0, kiln_tensor_nbytes(v.out[1]));
	return v;
}

static void views_free(views_io *v)
{
	for (int i = 0; i < 2; i++)
		kiln_tensor_free(v->in[i]);
	for (int i = 0; i < 3; i++)
		kiln_tensor_free(v->out[i]);
}

START_TEST(aliases_share_bytes_and_copy_views)
{
	rt_model *m = make(&views);
	views_io v = views_make(3);
	kiln_status st = rt_model_run_tensors(m, (const kiln_tensor *const *)v.in, 2, v.out, 3);
	ck_assert_msg(st == KILN_OK, "%s", rt_model_errmsg(m));
	const float *x = v.in[0]->data, *z = v.in[1]->data, *y = v.out[0]->data;
	for (int i = 0; i < 12; i++)
		ck_assert_float_eq(y[i], (x[i] > 0 ? x[i] : 0) + z[i / 4]);
	ck_assert_mem_eq(v.out[1]->data, x, 12 * sizeof(float)); /* xc = x */
	ck_assert_mem_eq(v.out[2]->data, y, 12 * sizeof(float)); /* yc = y */
	ck_assert(views_u_is_y);   /* the TEMP view was written into y itself */
	ck_assert(views_x_is_xc);  /* kernels read x from its copy */
	ck_assert_uint_eq(rt_model_arena_bytes(m), 64); /* only t: 48 -> 64 */
	views_free(&v);
	rt_model_destroy(m);
}
END_TEST

START_TEST(expr_output_dim_is_checked)
{
	rt_model *m = make(&views);
	views_io v = views_make(2);
	kiln_tensor_free(v.out[0]);
	v.out[0] = kiln_tensor_new(KILN_F32, 1, (int64_t[]){7});
	expect_fail(m, v.in, 2, v.out, 3, KILN_ESHAPE,
	            "output 'y': expected f32[?] (f32[8] for N = 2), got f32[7]");
	views_free(&v);
	rt_model_destroy(m);
}
END_TEST

START_TEST(inputs_must_agree_on_symbol)
{
	rt_model *m = make(&views);
	views_io v = views_make(2);
	kiln_tensor_free(v.in[1]);
	v.in[1] = f32(1, (int64_t[]){3});
	expect_fail(m, v.in, 2, v.out, 3, KILN_ESHAPE,
	            "input 'z': expected f32[N] with N = 2 (from input 'x'), got f32[3]");
	views_free(&v);
	rt_model_destroy(m);
}
END_TEST

/* ---- errors -------------------------------------------------------------- */

START_TEST(rejects_wrong_fixed_dim_dtype_and_rank)
{
	rt_model *m = make(&kiln_model_desc);
	kiln_tensor *y = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 4});
	kiln_tensor *bad[] = {
		f32(2, (int64_t[]){2, 5}),
		kiln_tensor_new(KILN_F64, 2, (int64_t[]){2, 4}),
		f32(3, (int64_t[]){2, 4, 1}),
	};
	expect_fail(m, &bad[0], 1, &y, 1, KILN_ESHAPE, "input 'x': expected f32[N,4], got f32[2,5]");
	expect_fail(m, &bad[1], 1, &y, 1, KILN_ESHAPE, "input 'x': expected f32[N,4], got f64[2,4]");
	expect_fail(m, &bad[2], 1, &y, 1, KILN_ESHAPE,
	            "input 'x': expected f32[N,4], got f32[2,4,1]");
	for (int i = 0; i < 3; i++)
		kiln_tensor_free(bad[i]);
	kiln_tensor_free(y);
	rt_model_destroy(m);
}
END_TEST

START_TEST(rejects_wrong_output_shape_before_running)
{
	rt_model *m = make(&kiln_model_desc);
	kiln_tensor *x = x_of(2), *y = kiln_tensor_new(KILN_F32, 2, (int64_t[]){3, 4});
	relu1_first_thread = -1;
	expect_fail(m, &x, 1, &y, 1, KILN_ESHAPE,
	            "output 'y': expected f32[N,4] (f32[2,4] for N = 2), got f32[3,4]");
	ck_assert_int_eq(relu1_first_thread, -1); /* no kernel ran */
	ck_assert_uint_eq(rt_model_arena_bytes(m), 0);
	kiln_tensor_free(x);
	kiln_tensor_free(y);
	rt_model_destroy(m);
}
END_TEST

START_TEST(rejects_batch_0)
{
	rt_model *m = make(&kiln_model_desc);
	kiln_tensor *x = x_of(0), *y = kiln_tensor_new(KILN_F32, 2, (int64_t[]){0, 4});
	expect_fail(m, &x, 1, &y, 1, KILN_EINVAL, "input 'x': batch N = 0 (got f32[0,4])");
	float a, b;
	ck_assert_int_eq(rt_model_run(m, (int64_t[]){0}, (const void *const[]){&a},
	                              (void *const[]){&b}),
	                 KILN_EINVAL);
	ck_assert_str_eq(rt_model_errmsg(m), "model 'relu1': batch N = 0; sizes must be at least 1");
	ck_assert_int_eq(rt_model_run(m, (int64_t[]){-2}, (const void *const[]){&a},
	                              (void *const[]){&b}),
	                 KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(rt_model_errmsg(m), "N = -2"));
	/* nor past 2^48, where sizes computed from symbols could overflow */
	ck_assert_int_eq(rt_model_run(m, (int64_t[]){(int64_t)1 << 49}, (const void *const[]){&a},
	                              (void *const[]){&b}),
	                 KILN_EINVAL);
	ck_assert_str_eq(rt_model_errmsg(m), "model 'relu1': N = 562949953421312; sizes must be "
	                 "in [1, 2^48]");
	kiln_tensor_free(x);
	kiln_tensor_free(y);
	rt_model_destroy(m);
}
END_TEST

START_TEST(rejects_null_pointers_naming_them)
{
	rt_model *m = make(&kiln_model_desc);
	kiln_tensor *x = x_of(2), *y = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 4});
	kiln_tensor *none = NULL;
	expect_fail(m, &none, 1, &y, 1, KILN_EINVAL, "input 0 ('x') is NULL");
	expect_fail(m, NULL, 1, &y, 1, KILN_EINVAL, "inputs is NULL");
	expect_fail(m, &x, 1, &none, 1, KILN_EINVAL, "output 0 ('y') is NULL");
	expect_fail(m, &x, 1, NULL, 1, KILN_EINVAL, "outputs is NULL");
	expect_fail(m, &x, 2, &y, 1, KILN_EINVAL, "model 'relu1' takes 1 input(s), got 2");
	ck_assert_int_eq(rt_model_run(m, NULL, (const void *const[]){x->data},
	                              (void *const[]){y->data}),
	                 KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(rt_model_errmsg(m), "syms is NULL"));
	ck_assert_int_eq(rt_model_run(m, (int64_t[]){2}, (const void *const[]){NULL},
	                              (void *const[]){y->data}),
	                 KILN_EINVAL);
	ck_assert_str_eq(rt_model_errmsg(m), "input 'x' is NULL");
	ck_assert_int_eq(rt_model_run(NULL, NULL, NULL, NULL), KILN_EINVAL);
	ck_assert_int_eq(rt_model_create(NULL, NULL), KILN_EINVAL);
	kiln_tensor_free(x);
	kiln_tensor_free(y);
	rt_model_destroy(m);
}
END_TEST

START_TEST(create_validates_description)
{
	char msg[256];
	rt_model *m = (rt_model *)1;
	rt_model_desc d = kiln_model_desc;
	d.abi = 99;
	ck_assert_int_eq(rt_model_create(&d, &m), KILN_EUNSUPPORTED);
	ck_assert_ptr_null(m);
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_EUNSUPPORTED);
	ck_assert_str_eq(msg, "model ABI 99 was written by a newer kiln; this runtime reads ABI 3 "
	                      "to 5");
	/* an ABI 2 library's own pool code reads this runtime's rt_exec and
	 * rt_pool with the old layout (it crashed with two threads): refused */
	d.abi = 2;
	ck_assert_int_eq(rt_model_create(&d, &m), KILN_EUNSUPPORTED);
	ck_assert_ptr_null(m);
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_EUNSUPPORTED);
	ck_assert_str_eq(msg, "model ABI 2 was written by an older kiln; this runtime reads ABI 3 "
	                      "to 5: compile the model again with this kiln");
	d.abi = 3;
	ck_assert_int_eq(rt_model_create(&d, &m), KILN_OK);
	rt_model_destroy(m);

	/* ABI 5's chunked runs: kernels in range, in order, buffers named */
	int32_t off[] = {0}, chunk_of[64];
	for (int i = 0; i < 64; i++)
		chunk_of[i] = -1;
	rt_chunk_desc runs[1] = {{.first = 0, .last = 0, .sym = 0, .chunk = 2, .noff = 1, .off = off}};
	d = views;
	d.nchunk = 1, d.chunks = runs, d.chunk_of = chunk_of;
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_OK);
	runs[0].last = (int32_t)d.nkern;
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_EINVAL);
	ck_assert_str_eq(msg, "chunked run 0: bad kernels, symbol, chunk or buffers");
	runs[0].last = 0, off[0] = (int32_t)d.nbuf;
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_EINVAL);
	off[0] = 0, chunk_of[0] = 1;
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_EINVAL);
	ck_assert_str_eq(msg, "buffer 0: bad chunked run");
	d.abi = 3; /* an ABI 3 description ends before the chunk fields: never read */
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_OK);

	rt_buf_desc cyc[7];
	memcpy(cyc, v_bufs, sizeof cyc);
	cyc[4].alias = 3; /* 3 -> 4 -> 3 */
	d = views;
	d.bufs = cyc;
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_EINVAL);
	ck_assert_str_eq(msg, "buffer 3: alias cycle");

	rt_io_desc in[2];
	memcpy(in, v_in, sizeof in);
	in[1].buf = 9;
	d = views;
	d.inputs = in;
	ck_assert_int_eq(rt_model_validate(&d, msg, sizeof msg), KILN_EINVAL);
	ck_assert_str_eq(msg, "input 1: bad name, dtype, rank or buffer");
}
END_TEST

/* ---- threads ------------------------------------------------------------- */

static _Atomic int hits[1000];

static void count_range(rt_exec *x, int64_t b, int64_t e)
{
	for (int64_t i = b; i < e; i++)
		atomic_fetch_add(&hits[i], 1);
}

START_TEST(parallel_for_covers_range_exactly_once)
{
	rt_pool *p;
	ck_assert_int_eq(rt_pool_new(3, 16, &p), KILN_OK);
	ck_assert_int_eq(rt_pool_threads(p), 3);
	rt_exec x = {.pool = p};
	static const int64_t ns[] = {0, 1, 2, 3, 7, 1000};
	for (int r = 0; r < 50; r++)
		for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
			for (int i = 0; i < 1000; i++)
				atomic_store(&hits[i], 0);
			rt_parallel_for(&x, ns[k], count_range);
			for (int64_t i = 0; i < 1000; i++)
				ck_assert_int_eq(atomic_load(&hits[i]), i < ns[k]);
		}
	rt_pool_free(p);
	ck_assert_int_eq(rt_pool_new(1, 0, &p), KILN_EINVAL);
}
END_TEST

static _Atomic int nested_bad, seen_thread[4];

static void inner(rt_exec *x, int64_t b, int64_t e)
{
	if (x->pool || b != 0 || e != 5)
		atomic_store(&nested_bad, 1);
}

static void outer(rt_exec *x, int64_t b, int64_t e)
{
	if (x->pool || !x->scratch || x->thread < 0 || x->thread > 3)
		atomic_store(&nested_bad, 1);
	else
		atomic_fetch_add(&seen_thread[x->thread], 1);
	x->scratch[0] = (float)x->thread; /* each thread writes its own */
	rt_parallel_for(x, 5, inner);     /* nested: inline, whole range */
}

START_TEST(nested_parallel_for_runs_inline_with_own_scratch)
{
	rt_pool *p;
	float mine[16];
	ck_assert_int_eq(rt_pool_new(4, 16, &p), KILN_OK);
	rt_exec x = {.pool = p, .scratch = mine};
	rt_parallel_for(&x, 8, outer);
	ck_assert_int_eq(atomic_load(&nested_bad), 0);
	int chunks = 0;
	for (int t = 0; t < 4; t++)
		chunks += atomic_load(&seen_thread[t]);
	ck_assert_int_eq(chunks, 4);                 /* one chunk per thread's worth */
	ck_assert_int_ge(atomic_load(&seen_thread[0]), 1); /* the caller runs chunk 0 */
	ck_assert_float_eq(mine[0], 0);
	rt_pool_free(p);
}
END_TEST

static _Atomic int started;

/* Chunk 0 (the caller's) waits until chunk 1 has started elsewhere, so
 * only a worker can have run it. */
static void rendezvous(rt_exec *x, int64_t b, int64_t e)
{
	atomic_fetch_add(&started, 1);
	for (long i = 0; b == 0 && atomic_load(&started) < 2 && i < 5000000L; i++) /* about 5 s */
		sched_yield();
	if (b == 0 && atomic_load(&started) < 2)
		atomic_store(&nested_bad, 2); /* no worker came */
}

START_TEST(workers_run_chunks_concurrently)
{
	rt_pool *p;
	ck_assert_int_eq(rt_pool_new(2, 0, &p), KILN_OK);
	rt_exec x = {.pool = p};
	for (int r = 0; r < 3; r++) {
		atomic_store(&started, 0);
		rt_parallel_for(&x, 2, rendezvous);
		ck_assert_int_eq(atomic_load(&started), 2);
		ck_assert_int_eq(atomic_load(&nested_bad), 0);
		usleep(300000); /* workers asleep on the condvar now: wake-up path */
	}
	rt_pool_free(p);
}
END_TEST

START_TEST(threads_1_and_2_give_identical_results)
{
	rt_model *m = make(&kiln_model_desc);
	kiln_tensor *x = x_of(1001), *y1 = kiln_tensor_new(KILN_F32, 2, (int64_t[]){1001, 4}),
		    *y2 = kiln_tensor_new(KILN_F32, 2, (int64_t[]){1001, 4});
	const kiln_tensor *const in[] = {x};
	ck_assert_int_eq(rt_model_set_threads(m, 1), KILN_OK);
	ck_assert_int_eq(rt_model_run_tensors(m, in, 1, &y1, 1), KILN_OK);
	ck_assert_int_eq(relu1_last_thread, 0);
	ck_assert_int_eq(rt_model_set_threads(m, 2), KILN_OK);
	for (int r = 0; r < 20; r++) {
		relu1_last_thread = -1;
		ck_assert_int_eq(rt_model_run_tensors(m, in, 1, &y2, 1), KILN_OK);
		ck_assert_mem_eq(y1->data, y2->data, kiln_tensor_nbytes(y1));
		ck_assert_int_eq(relu1_first_thread, 0); /* the caller runs chunk 0 */
		ck_assert(relu1_last_thread == 0 || relu1_last_thread == 1);
	}
	ck_assert_int_eq(relu1_scratch_bad, 0);
	check_relu1(x, y2);
	ck_assert_int_eq(rt_model_set_threads(m, -1), KILN_EINVAL);
	ck_assert_str_eq(rt_model_errmsg(m), "model 'relu1': thread count -1 is not in [0, 256]");
	kiln_tensor_free(x);
	kiln_tensor_free(y1);
	kiln_tensor_free(y2);
	rt_model_destroy(m);
}
END_TEST

START_TEST(num_threads_env_is_read_at_create)
{
	setenv("KILN_NUM_THREADS", "2", 1);
	rt_model *m = make(&kiln_model_desc);
	unsetenv("KILN_NUM_THREADS");
	ck_assert_int_eq(rt_model_threads(m), 2);
	run_relu1(m, 10);
	ck_assert_int_eq(rt_model_set_threads(m, 0), KILN_OK); /* env unset now: 1 */
	ck_assert_int_eq(rt_model_threads(m), 1);
	relu1_last_thread = -1;
	run_relu1(m, 10);
	ck_assert_int_eq(relu1_last_thread, 0);
	setenv("KILN_NUM_THREADS", "lots", 1);
	ck_assert_int_eq(rt_model_set_threads(m, 0), KILN_OK); /* not a number: 1 */
	ck_assert_int_eq(rt_model_threads(m), 1);
	unsetenv("KILN_NUM_THREADS");
	rt_model_destroy(m);
}
END_TEST

/* ---- the loader, on relu1.so -------------------------------------------- */

static char so_path[1200];

/* relu1.so, built once per process as kiln compile would link it. */
static void build_relu1(void)
{
	static bool built;
	char src[1024], out[8192];
	if (built)
		return;
	snprintf(so_path, sizeof so_path, "%s/relu1.so", so_dir("rt_model_test"));
	snprintf(src, sizeof src, "%s/tests/fixtures/rt/relu1.c", KILN_SRC);
	ck_assert_msg(build_so(src, so_path, out, sizeof out) == 0, "cc failed:\n%s", out);
	built = true;
}

START_TEST(load_describes_signature)
{
	kiln_model *m;
	kiln_error e = {0};
	build_relu1();
	ck_assert_msg(kiln_load(so_path, &m, &e) == KILN_OK, "%s", e.msg);
	ck_assert_str_eq(kiln_model_name(m), "relu1");
	ck_assert_int_eq(kiln_model_num_inputs(m), 1);
	ck_assert_int_eq(kiln_model_num_outputs(m), 1);
	ck_assert_int_eq(kiln_model_num_syms(m), 1);
	ck_assert_str_eq(kiln_model_sym_name(m, 0), "N");
	ck_assert_str_eq(kiln_model_input_name(m, 0), "x");
	ck_assert_str_eq(kiln_model_output_name(m, 0), "y");
	const kiln_model_io *io = kiln_model_input(m, 0);
	ck_assert_int_eq(io->dtype, KILN_F32);
	ck_assert_int_eq(io->rank, 2);
	ck_assert_int_eq(io->dims[0], -1);
	ck_assert_str_eq(io->dim_names[0], "N");
	ck_assert_int_eq(io->dims[1], 4);
	ck_assert_ptr_null(io->dim_names[1]);
	ck_assert_ptr_null(kiln_model_input(m, 1));
	ck_assert_ptr_null(kiln_model_output(m, -1));
	kiln_model_free(m);
}
END_TEST

START_TEST(loaded_model_runs_and_reports_errors)
{
	kiln_model *m;
	kiln_error e = {0};
	build_relu1();
	ck_assert_msg(kiln_load(so_path, &m, &e) == KILN_OK, "%s", e.msg);
	for (int threads = 1; threads <= 2; threads++) {
		ck_assert_int_eq(kiln_model_set_threads(m, threads, &e), KILN_OK);
		kiln_tensor *x = x_of(6), *y = NULL;
		ck_assert_msg(kiln_model_run(m, &x, 1, &y, 1, &e) == KILN_OK, "%s", e.msg);
		ck_assert_int_eq(y->shape[0], 6);
		check_relu1(x, y);
		kiln_tensor_free(x);
		kiln_tensor_free(y);
	}
	kiln_tensor *bad = f32(2, (int64_t[]){3, 3}), *y = (kiln_tensor *)1;
	ck_assert_int_eq(kiln_model_run(m, &bad, 1, &y, 1, &e), KILN_ESHAPE);
	ck_assert_ptr_null(y);
	ck_assert_str_eq(e.msg, "input 'x': expected f32[N,4], got f32[3,3]");
	ck_assert_int_eq(kiln_model_run(m, &bad, 1, &y, 2, &e), KILN_EINVAL);
	ck_assert_str_eq(e.msg, "model 'relu1' has 1 output(s), got 2");
	kiln_tensor_free(bad);
	kiln_model_free(m);
}
END_TEST

START_TEST(load_rejects_missing_and_foreign_libraries)
{
	kiln_model *m = (kiln_model *)1;
	kiln_error e = {0};
	ck_assert_int_eq(kiln_load("/nonexistent/model.so", &m, &e), KILN_EIO);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(strstr(e.msg, "cannot load '/nonexistent/model.so'"));
	ck_assert_int_eq(kiln_load("libm.so.6", &m, &e), KILN_EIO); /* a file, not a search */
	char out[8192], src[1200], so[1200];
	snprintf(src, sizeof src, "%s/foreign.c", so_dir("rt_model_test"));
	snprintf(so, sizeof so, "%s/foreign.so", so_dir("rt_model_test"));
	FILE *f = fopen(src, "w");
	ck_assert_ptr_nonnull(f);
	fputs("int answer(void) { return 42; }\n", f);
	fclose(f);
	ck_assert_msg(build_so(src, so, out, sizeof out) == 0, "%s", out);
	ck_assert_int_eq(kiln_load(so, &m, &e), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "not a kiln model (no kiln_model_desc symbol)"));
	ck_assert_int_eq(kiln_load(NULL, &m, &e), KILN_EINVAL);
	ck_assert_str_eq(e.msg, "kiln_load: path is NULL");
}
END_TEST

START_TEST(library_needs_only_libc_libm_libpthread)
{
	char extra[1024];
	build_relu1();
	if (!have_tool("readelf")) {
		printf("skipped: readelf not found\n");
		return;
	}
	ck_assert(extra_needed(so_path, extra, sizeof extra));
	ck_assert_msg(!extra[0], "relu1.so needs %s", extra);
}
END_TEST

START_TEST(valgrind_create_run_destroy_is_clean)
{
	char exe[1200], out[16384];
	build_relu1();
	if (!have_tool("valgrind")) {
		printf("skipped: valgrind not found\n");
		return;
	}
	snprintf(exe, sizeof exe, "%s/drive", so_dir("rt_model_test"));
	ck_assert_msg(build_driver(exe, out, sizeof out) == 0, "cc failed:\n%s", out);
	int rc = valgrind(exe, so_path, out, sizeof out);
	ck_assert_msg(rc == 0, "valgrind exit %d:\n%s", rc, out);
}
END_TEST

/* ---- the CLI on relu1.so: kiln run, kiln bench -------------------------- */

START_TEST(cli_run_writes_outputs_of_a_library)
{
	char cmd[4096], out[8192], xpath[1300], ypath[1300];
	build_relu1();
	const char *dir = so_dir("rt_model_test");
	snprintf(xpath, sizeof xpath, "%s/x.npy", dir);
	snprintf(ypath, sizeof ypath, "%s/out/y.npy", dir);
	kiln_tensor *x = x_of(3), *y = NULL;
	ck_assert_int_eq(kiln_npy_write(xpath, x, NULL), KILN_OK);
	snprintf(cmd, sizeof cmd, "'%s/kiln' run '%s' -i x='%s' -o '%s/out'", KILN_BIN, so_path,
	         xpath, dir);
	ck_assert_msg(sh(cmd, out, sizeof out) == 0, "%s", out);
	ck_assert_ptr_nonnull(strstr(out, "y: f32[3,4] -> "));
	ck_assert_int_eq(kiln_npy_read(ypath, &y, NULL), KILN_OK);
	check_relu1(x, y);
	kiln_tensor_free(y);
	kiln_tensor_free(x);
	snprintf(cmd, sizeof cmd, "'%s/kiln' run '%s'", KILN_BIN, so_path);
	ck_assert_int_eq(sh(cmd, out, sizeof out), 2);
	ck_assert_str_eq(out, "kiln: error: missing input 'x' (f32[N,4]): give -i x=FILE.npy\n");
}
END_TEST

START_TEST(cli_bench_reports_median_of_runs)
{
	char cmd[4096], out[8192];
	build_relu1();
	snprintf(cmd, sizeof cmd, "'%s/kiln' bench '%s' --batch 3 --threads 2 --runs 7 --json",
	         KILN_BIN, so_path);
	ck_assert_msg(sh(cmd, out, sizeof out) == 0, "%s", out);
	ck_assert_ptr_nonnull(strstr(out, "{\"model\": \"relu1\", \"batch\": 3, \"threads\": 2, "
	                                  "\"runs\": 7, \"median_ms\": "));
	snprintf(cmd, sizeof cmd, "'%s/kiln' bench '%s' --batch 0", KILN_BIN, so_path);
	ck_assert_int_eq(sh(cmd, out, sizeof out), 2);
	ck_assert_ptr_nonnull(strstr(out, "--batch must be at least 1"));
}
END_TEST

/* ---- suite --------------------------------------------------------------- */

static Suite *runtime_model_suite(void)
{
	Suite *s = suite_create("runtime_model");
	TCase *tc = tcase_create("driver");
	tcase_add_test(tc, relu1_correct_at_several_batches);
	tcase_add_test(tc, arena_grows_only_for_larger_batch);
	tcase_add_test(tc, typed_run_takes_symbols_explicitly);
	tcase_add_test(tc, output_shape_follows_batch);
	suite_add_tcase(s, tc);
	tc = tcase_create("aliases");
	tcase_add_test(tc, aliases_share_bytes_and_copy_views);
	tcase_add_test(tc, expr_output_dim_is_checked);
	tcase_add_test(tc, inputs_must_agree_on_symbol);
	suite_add_tcase(s, tc);
	tc = tcase_create("errors");
	tcase_add_test(tc, rejects_wrong_fixed_dim_dtype_and_rank);
	tcase_add_test(tc, rejects_wrong_output_shape_before_running);
	tcase_add_test(tc, rejects_batch_0);
	tcase_add_test(tc, rejects_null_pointers_naming_them);
	tcase_add_test(tc, create_validates_description);
	suite_add_tcase(s, tc);
	tc = tcase_create("threads");
	tcase_add_test(tc, parallel_for_covers_range_exactly_once);
	tcase_add_test(tc, nested_parallel_for_runs_inline_with_own_scratch);
	tcase_add_test(tc, workers_run_chunks_concurrently);
	tcase_add_test(tc, threads_1_and_2_give_identical_results);
	tcase_add_test(tc, num_threads_env_is_read_at_create);
	suite_add_tcase(s, tc);
	tc = tcase_create("loader");
	tcase_set_timeout(tc, 120); /* cc and valgrind */
	tcase_add_test(tc, load_describes_signature);
	tcase_add_test(tc, loaded_model_runs_and_reports_errors);
	tcase_add_test(tc, load_rejects_missing_and_foreign_libraries);
	tcase_add_test(tc, library_needs_only_libc_libm_libpthread);
	tcase_add_test(tc, valgrind_create_run_destroy_is_clean);
	tcase_add_test(tc, cli_run_writes_outputs_of_a_library);
	tcase_add_test(tc, cli_bench_reports_median_of_runs);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(runtime_model_suite)
