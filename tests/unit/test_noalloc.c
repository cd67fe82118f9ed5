/*
 * test_noalloc.c: a generated library's run makes no heap call once its
 * context is warm.  The example MLP and CNN (examples/models.h) and a
 * compiled CNN train step are run by tests/fixtures/rt/count_alloc.c, a
 * program that defines malloc, calloc, realloc, free and the aligned
 * allocators itself (forwarding to glibc's __libc_* functions) and counts
 * the calls made from any thread while a run is in progress: five runs
 * after two warm-up runs, at 1 and 2 threads, through the typed entry
 * points (dlsym) and through kiln_load's kiln_model_run_into /
 * kiln_model_train_step.  Every such count must be 0.  The counter is shown
 * to work on the same library: _create, and a run at a larger batch (the
 * scratch arena grows), must both be seen allocating.  The CNN compiled with
 * KILN_CHUNK=2 runs chunk by chunk at batch 4; its one run spans the model,
 * so its scratch holds one chunk and does not grow with the batch.
 *
 * The program is built against the never-sanitized runtime archive that
 * `kiln compile` links, so the test means the same in an ASan build.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "examples/models.h"
#include "kiln/kiln.h"
#include "runtime/model.h"
#include "so_util.h"

static char counter_exe[1200];

/* count_alloc, built once per process. */
static const char *counter(void)
{
	if (counter_exe[0])
		return counter_exe;
	char exe[1200], cmd[4096], out[8192];
	snprintf(exe, sizeof exe, "%s/count_alloc", so_dir("noalloc_test"));
	snprintf(cmd, sizeof cmd,
	         "cc -O1 -g -rdynamic -I'%s/include' -I'%s' -o '%s' "
	         "'%s/tests/fixtures/rt/count_alloc.c' '%s' -ldl -lm -lpthread",
	         KILN_SRC, KILN_SRC, exe, KILN_SRC, KILN_RT_GEN_LIB);
	ck_assert_msg(sh(cmd, out, sizeof out) == 0, "building count_alloc failed:\n%s", out);
	memcpy(counter_exe, exe, sizeof exe);
	return counter_exe;
}

/* The count a line "<what> t<threads>: <n> heap calls" of out reports,
 * failing when there is no such line. */
static long count_of(const char *out, const char *what, int threads)
{
	char key[128];
	snprintf(key, sizeof key, "%s t%d: ", what, threads);
	for (const char *p = strstr(out, key); p; p = strstr(p + 1, key))
		if (p == out || p[-1] == '\n')
			return strtol(p + strlen(key), NULL, 10);
	ck_abort_msg("no line '%s' in:\n%s", key, out);
	return -1;
}

/* Runs count_alloc on so and checks every count it prints. */
/* grows: a run at a larger batch must be seen growing the scratch (not
 * where one chunked run spans the model: the arena then holds one chunk) */
static void expect_no_heap_calls(const char *so, const char *prefix, int batch, bool train,
                                 bool grows)
{
	char cmd[4096], out[16384];
	snprintf(cmd, sizeof cmd, "'%s' '%s' %s %d%s", counter(), so, prefix, batch,
	         grows ? "" : " nogrow");
	int rc = sh(cmd, out, sizeof out);
	ck_assert_msg(count_of(out, "create", 1) > 0, "the counter saw no allocation:\n%s", out);
	const char *steady[] = {train ? "eval_step" : "run", "kiln_model_run_into", "train_step",
	                        "kiln_model_train_step"};
	for (int threads = 1; threads <= 2; threads++)
		for (int i = 0; i < (train ? 4 : 2); i++)
			ck_assert_msg(count_of(out, steady[i], threads) == 0,
			              "%s at %d threads allocates:\n%s", steady[i], threads, out);
	if (!train && grows)
		ck_assert_msg(count_of(out, "grow", 2) > 0,
		              "growing the scratch was not seen allocating:\n%s", out);
	ck_assert_msg(rc == 0, "count_alloc exited %d:\n%s", rc, out);
}

static kiln_graph *traced(const char *name, bool training, int rank, const int64_t *sample,
                          kiln_value (*body)(kiln_graph *, kiln_value))
{
	kiln_graph *g = kiln_graph_new(name);
	ck_assert_ptr_nonnull(g);
	kiln_graph_set_training(g, training);
	kiln_graph_seed(g, 3);
	int64_t dims[KILN_MAX_RANK] = {kiln_sym(g, "N")};
	memcpy(dims + 1, sample, (size_t)(rank - 1) * sizeof *dims);
	kiln_output(g, "logits", body(g, kiln_input(g, "x", KILN_F32, rank, dims)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

static void compiled(kiln_graph *g, const char *name, char *so, size_t size)
{
	snprintf(so, size, "%s/%s.so", so_dir("noalloc_test"), name);
	kiln_error e = {0};
	kiln_compile_opts o = {.name = name};
	ck_assert_msg(kiln_compile(g, so, &o, &e) == KILN_OK, "kiln_compile %s: %s", name, e.msg);
}

START_TEST(mlp_run_makes_no_heap_calls)
{
	kiln_graph *g = traced("mlp", false, 2, (int64_t[]){784}, example_mlp);
	char so[1300];
	compiled(g, "mlp", so, sizeof so);
	expect_no_heap_calls(so, "mlp", 8, false, true);
	kiln_graph_free(g);
}
END_TEST

START_TEST(cnn_run_makes_no_heap_calls)
{
	kiln_graph *g = traced("cnn", false, 4, (int64_t[]){1, 28, 28}, example_cnn);
	char so[1300];
	compiled(g, "cnn", so, sizeof so);
	expect_no_heap_calls(so, "cnn", 4, false, true);
	kiln_graph_free(g);
}
END_TEST

/* The CNN run chunk by chunk (KILN_CHUNK=2 at compile time, batch 4): the
 * driver's chunk loop and chunk-sized scratch make no heap call either. */
START_TEST(chunked_run_makes_no_heap_calls)
{
	kiln_graph *g = traced("ccnn", false, 4, (int64_t[]){1, 28, 28}, example_cnn);
	char so[1300];
	setenv("KILN_CHUNK", "2", 1);
	compiled(g, "ccnn", so, sizeof so);
	unsetenv("KILN_CHUNK");
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "dlopen: %s", dlerror());
	const rt_model_desc *d = dlsym(h, "kiln_model_desc");
	ck_assert_msg(d && d->nchunk >= 1, "the library has no chunked run");
	dlclose(h);
	expect_no_heap_calls(so, "ccnn", 4, false, false);
	kiln_graph_free(g);
}
END_TEST

/* conv, BatchNorm (batch statistics in the step), ReLU, max pool, linear */
static kiln_value small_cnn(kiln_graph *g, kiln_value x)
{
	kiln_conv_opts c = {.kernel = {3, 3}, .pad = {1, 1}};
	kiln_value h = kiln_conv2d(g, "conv1", x, 4, &c, true);
	h = kiln_relu(g, kiln_batchnorm(g, "bn1", h, 0, 0));
	h = kiln_max_pool(g, h, &(kiln_conv_opts){.kernel = {2, 2}, .stride = {2, 2}});
	return kiln_linear(g, "fc", kiln_flatten(g, h, 1), 10, true);
}

START_TEST(train_step_makes_no_heap_calls)
{
	kiln_graph *m = traced("tcnn", true, 4, (int64_t[]){1, 8, 8}, small_cnn);
	kiln_graph *e = traced("tcnn", false, 4, (int64_t[]){1, 8, 8}, small_cnn);
	char so[1300];
	snprintf(so, sizeof so, "%s/tcnn.so", so_dir("noalloc_test"));
	kiln_train_opts o = {.optim = KILN_OPT_ADAMW, .weight_decay = 0.01,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	kiln_error err = {0};
	ck_assert_msg(kiln_compile_train(m, e, &o, 8, so, &(kiln_compile_opts){.name = "tcnn"},
	                                 &err) == KILN_OK, "kiln_compile_train: %s", err.msg);
	expect_no_heap_calls(so, "tcnn", 8, true, true);
	kiln_graph_free(m), kiln_graph_free(e);
}
END_TEST

static Suite *noalloc_suite(void)
{
	Suite *s = suite_create("noalloc");
	TCase *tc = tcase_create("runs");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, mlp_run_makes_no_heap_calls);
	tcase_add_test(tc, cnn_run_makes_no_heap_calls);
	tcase_add_test(tc, chunked_run_makes_no_heap_calls);
	tcase_add_test(tc, train_step_makes_no_heap_calls);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(noalloc_suite)
