/*
 * test_cuda_emu_train.c: CUDA training steps without a GPU (docs/CUDA.md,
 * "Training steps").
 *
 * `kiln_compile_train` with --target=cuda-emu prints the train step and
 * the eval program through the CUDA printer (the kernels a GPU would run),
 * compiles that text for this CPU (launches as loops over blocks and
 * threads) and describes it to runtime/model_train.c exactly as the LLVM
 * library does, so kiln_load trains it.  The parity models of
 * test_compiled_train.c (train_models.h: the MLP with its symbolic batch,
 * the Conv-BatchNorm CNN at batch 16) train 20 steps with SGD-momentum and
 * with AdamW through the emulated library and through the CPU library:
 * every step's loss within 1e-4 relative, the final state (parameters,
 * moments, BatchNorm buffers) within 1e-5 absolute plus 1e-5 relative,
 * the step counters equal.  One exception: under AdamW the CNN's conv1.bias
 * feeds a train-mode BatchNorm, so its gradient is rounding noise, which
 * AdamW turns into full steps; that bias, its moments and bn1.running_mean
 * are left out (noise_gradient says how they are found).  A checkpoint the emulated library saves loads
 * into the CPU library and gives its eval outputs.  With NVRTC in this
 * build the same step programs (--emit=cu) compile for sm_80 and sm_90
 * (cubin) and compute_90 (PTX) with warnings counted as failures; without
 * it those tests are left out and the run says so.  The CUDA libraries of
 * the MLP's and the CNN's steps (state in device memory, NVRTC images
 * embedded) build with their header and entry points; without a driver
 * _create_ex fails with inference's "libcuda.so.1 not found" message and
 * kiln_load says it runs CPU and emulated libraries only; on a GPU
 * (bench/gpu.sh) they train 20 steps against the CPU libraries, losses
 * within 1e-4 relative and the state read back within 1e-5.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "codegen/cuda.h"
#include "so_util.h"
#include "testutil.h"
#include "train_models.h"

#define STEPS 20

/* run ("mlp_sgd", ...) compiled for target into so_dir, once per process. */
static const char *compiled(const char *run, const char *target)
{
	static char paths[8][1200];
	static const char *runs[4] = {"mlp_sgd", "mlp_adamw", "cnn_sgd", "cnn_adamw"};
	int r = 0;
	while (r < 4 && strcmp(runs[r], run))
		r++;
	ck_assert_int_lt(r, 4);
	bool emu = !strcmp(target, "cuda-emu");
	char *path = paths[r * 2 + emu];
	if (path[0])
		return path;
	char name[4];
	snprintf(name, sizeof name, "%.3s", run);
	kiln_graph *m = model(name, true), *e = model(name, false);
	snprintf(path, 1200, "%s/%s_%s.so", so_dir("cuda_emu_train_test"), run,
	         emu ? "emu" : "cpu");
	kiln_error err = {0};
	kiln_status st = kiln_compile_train(m, e, strstr(run, "sgd") ? &SGD : &ADAMW,
	                                    name[0] == 'c' ? 16 : 0, path,
	                                    &(kiln_compile_opts){.name = name, .target = target},
	                                    &err);
	ck_assert_msg(st == KILN_OK, "kiln_compile_train %s --target=%s: %s", run, target, err.msg);
	kiln_graph_free(m), kiln_graph_free(e);
	return path;
}

static kiln_model *open_lib(const char *path)
{
	kiln_model *m = NULL;
	kiln_error err;
	ck_assert_msg(kiln_load(path, &m, &err) == KILN_OK, "%s", err.msg);
	ck_assert(kiln_model_trainable(m));
	return m;
}

/* Whether state tensor name (a parameter or one of its AdamW moments) has
 * a gradient of rounding noise only: its exp_avg_sq below 1e-12 in both
 * states.  That is a conv bias feeding a train-mode BatchNorm, whose
 * gradient is zero analytically (~1e-8 computed); AdamW divides that noise
 * by its own root mean square and steps lr either way, so the two
 * libraries' biases walk apart while the loss cannot tell (the BatchNorm
 * removes them).  SGD moves such a parameter by the noise only. */
static bool noise_gradient(const kiln_tensor_set *a, const kiln_tensor_set *b, const char *name)
{
	char sq[512];
	size_t n = strlen(name);
	const char *suffix[] = {".exp_avg_sq", ".exp_avg"};
	for (int i = 0; i < 2; i++)
		if (n > strlen(suffix[i]) && !strcmp(name + n - strlen(suffix[i]), suffix[i]))
			n -= strlen(suffix[i]);
	snprintf(sq, sizeof sq, "%.*s.exp_avg_sq", (int)n, name);
	const kiln_tensor *x = kiln_tensor_set_get(a, sq), *y = kiln_tensor_set_get(b, sq);
	for (int64_t k = 0; x && y && k < kiln_tensor_numel(x); k++)
		if (kiln_tensor_get(x, k) >= 1e-12 || kiln_tensor_get(y, k) >= 1e-12)
			return false;
	return x && y;
}

/* Largest |a - b| / (1 + |b|) over every tensor of two states (same names,
 * dtypes and shapes) but those of noise_gradient and, when there are any,
 * the BatchNorm running means (which average the walked-apart biases in),
 * counted in *skipped. */
static double state_diff(const kiln_tensor_set *a, const kiln_tensor_set *b, const char *run,
                         int *skipped)
{
	ck_assert_int_eq(a->count, b->count);
	double worst = 0;
	bool noise = false;
	for (int i = 0; i < a->count; i++)
		noise |= noise_gradient(a, b, a->items[i].name);
	*skipped = 0;
	for (int i = 0; i < a->count; i++) {
		const char *name = a->items[i].name;
		const kiln_tensor *x = a->items[i].tensor, *y = kiln_tensor_set_get(b, name);
		ck_assert_msg(y, "%s: '%s' missing from the CPU state", run, name);
		ck_assert_int_eq(x->dtype, y->dtype);
		ck_assert_int_eq(kiln_tensor_numel(x), kiln_tensor_numel(y));
		if (noise_gradient(a, b, name) || (noise && strstr(name, ".running_mean"))) {
			printf("%s: '%s' left out (%s)\n", run, name, strstr(name, ".running_mean")
			       ? "it averages a noise-driven bias" : "its gradient is rounding noise");
			++*skipped;
			continue;
		}
		for (int64_t k = 0; k < kiln_tensor_numel(x); k++) {
			double u = kiln_tensor_get(x, k), v = kiln_tensor_get(y, k);
			double e = fabs(u - v) / (1 + fabs(v));
			ck_assert_msg(!isnan(e), "%s: '%s'[%lld] is NaN", run, name, (long long)k);
			worst = fmax(worst, e);
		}
	}
	return worst;
}

/* 20 steps of run through both libraries: losses within 1e-4 relative at
 * every step, the final states within 1e-5. */
static void emu_matches_cpu(const char *run, double lr)
{
	char name[4];
	snprintf(name, sizeof name, "%.3s", run);
	data d = load_data(name);
	kiln_model *cpu = open_lib(compiled(run, "llvm")), *emu = open_lib(compiled(run, "cuda-emu"));
	double worst = 0;
	for (int s = 0; s < STEPS; s++) {
		double want = step(cpu, d, s, lr), got = step(emu, d, s, lr);
		double rel = fabs(got - want) / fabs(want);
		worst = fmax(worst, rel);
		ck_assert_msg(rel <= 1e-4, "%s step %d: cuda-emu %.9g, cpu %.9g (rel %.3g > 1e-4)", run,
		              s, got, want, rel);
	}
	ck_assert_int_eq(kiln_model_steps(emu), STEPS);
	ck_assert_int_eq(kiln_model_steps(cpu), STEPS);
	kiln_tensor_set *se = kiln_model_state(emu), *sc = kiln_model_state(cpu);
	ck_assert_ptr_nonnull(se);
	ck_assert_ptr_nonnull(sc);
	int skipped;
	double sd = state_diff(se, sc, run, &skipped);
	/* at most one parameter (and its two moments) of noise, conv1.bias, and
	 * the running mean of the BatchNorm it feeds */
	ck_assert_int_le(skipped, 4);
	printf("%s: cuda-emu against the CPU library: losses within %.3g relative, state within "
	       "%.3g\n", run, worst, sd);
	ck_assert_msg(sd <= 1e-5, "%s: final state differs by %.3g > 1e-5", run, sd);
	kiln_tensor_set_free(se), kiln_tensor_set_free(sc);
	kiln_model_free(cpu), kiln_model_free(emu);
	free_data(d);
}

START_TEST(mlp_sgd_momentum_emulated_matches_cpu)
{
	emu_matches_cpu("mlp_sgd", 0.1);
}
END_TEST

START_TEST(mlp_adamw_emulated_matches_cpu)
{
	emu_matches_cpu("mlp_adamw", 0.01);
}
END_TEST

START_TEST(cnn_sgd_momentum_emulated_matches_cpu)
{
	emu_matches_cpu("cnn_sgd", 0.1);
}
END_TEST

START_TEST(cnn_adamw_emulated_matches_cpu)
{
	emu_matches_cpu("cnn_adamw", 0.01);
}
END_TEST

/* Largest |a - b| of two f32 tensors of one shape. */
static double max_abs(const kiln_tensor *a, const kiln_tensor *b)
{
	ck_assert_int_eq(kiln_tensor_numel(a), kiln_tensor_numel(b));
	double w = 0;
	for (int64_t k = 0; k < kiln_tensor_numel(a); k++)
		w = fmax(w, fabs(kiln_tensor_get(a, k) - kiln_tensor_get(b, k)));
	return w;
}

/* The emulated CNN trained 6 steps and saved; the checkpoint loaded into a
 * fresh CPU library gives the emulated library's eval outputs (and not the
 * untrained ones). */
START_TEST(checkpoint_from_emulated_library_loads_into_cpu_library)
{
	data d = load_data("cnn");
	kiln_model *emu = open_lib(compiled("cnn_adamw", "cuda-emu"));
	kiln_model *cpu = open_lib(compiled("cnn_adamw", "llvm"));
	for (int s = 0; s < 6; s++)
		step(emu, d, s, 0.01);
	char ckpt[1300];
	snprintf(ckpt, sizeof ckpt, "%s/emu_ckpt.safetensors", so_dir("cuda_emu_train_test"));
	kiln_error err;
	ck_assert_msg(kiln_model_save(emu, ckpt, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor x = view(d.x, 7);
	kiln_tensor *xs[1] = {&x}, *want[1] = {0}, *before[1] = {0}, *got[1] = {0};
	ck_assert_msg(kiln_model_run(emu, xs, 1, want, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_model_run(cpu, xs, 1, before, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_model_load(cpu, ckpt, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(kiln_model_steps(cpu), 6);
	ck_assert_msg(kiln_model_run(cpu, xs, 1, got, 1, &err) == KILN_OK, "%s", err.msg);
	double moved = max_abs(before[0], want[0]), e = max_abs(got[0], want[0]);
	printf("checkpoint: CPU eval after loading the emulated library's checkpoint within %.3g "
	       "of its eval (training moved the logits by %.3g)\n", e, moved);
	ck_assert_msg(moved > 1e-3, "6 steps did not change the logits (%.3g)", moved);
	ck_assert_msg(e <= 1e-5, "eval after load differs by %.3g", e);
	unlink(ckpt);
	kiln_tensor_free(want[0]), kiln_tensor_free(before[0]), kiln_tensor_free(got[0]);
	kiln_model_free(cpu), kiln_model_free(emu);
	free_data(d);
}
END_TEST

/* The train step and eval programs as CUDA C (--emit=cu), NVRTC-compiled
 * for sm_80 and sm_90 (cubin) and compute_90 (PTX), warnings as failures. */
START_TEST(train_programs_compile_with_nvrtc)
{
	static const char *const runs[] = {"mlp_sgd", "mlp_adamw", "cnn_sgd", "cnn_adamw"};
	for (int r = 0; r < 4; r++) {
		char name[4], cu[1300];
		snprintf(name, sizeof name, "%.3s", runs[r]);
		snprintf(cu, sizeof cu, "%s/%s.cu", so_dir("cuda_emu_train_test"), runs[r]);
		kiln_graph *m = model(name, true), *e = model(name, false);
		kiln_error err = {0};
		kiln_status st = kiln_compile_train(m, e, strstr(runs[r], "sgd") ? &SGD : &ADAMW,
		                                    name[0] == 'c' ? 16 : 0, cu,
		                                    &(kiln_compile_opts){.name = name, .target = "cuda",
		                                                         .emit = "cu"}, &err);
		ck_assert_msg(st == KILN_OK, "%s: %s", runs[r], err.msg);
		kiln_graph_free(m), kiln_graph_free(e);
		char *text = tu_slurp(cu, NULL);
		ck_assert_ptr_nonnull(text);
		char eval_kernel[64];
		snprintf(eval_kernel, sizeof eval_kernel, "%s_eval_", name);
		ck_assert_msg(strstr(text, eval_kernel), "%s: no eval program in the CUDA C", runs[r]);
		const char *arch[3] = {"sm_80", "sm_90", "sm_90"};
		for (int a = 0; a < 3; a++) {
			void *img = NULL;
			size_t n = 0;
			st = cg_nvrtc_compile(text, runs[r], arch[a], a == 2, true, false, &img, &n, &err);
			ck_assert_msg(st == KILN_OK && n > 0, "%s (%s%s): %s", runs[r], arch[a],
			              a == 2 ? " PTX" : "", err.msg);
			free(img);
		}
		free(text);
		unlink(cu);
	}
}
END_TEST

/* On a GPU: the CUDA library of run trains 20 steps through its typed
 * entry points beside the CPU library (kiln_load), every loss within 1e-4
 * relative, then every state tensor read back within 1e-5 (the CPU state
 * as the reference, noise_gradient's tensors left out). */
static void gpu_matches_cpu(void *h, void *ctx, const char *run, double lr)
{
	char name[4], fn[64];
	snprintf(name, sizeof name, "%.3s", run);
	bool mlp_run = name[0] == 'm';
	typedef int (*step_sym)(void *, int64_t, const float *, const int64_t *, double, float *);
	typedef int (*step_fixed)(void *, const float *, const int64_t *, double, float *);
	snprintf(fn, sizeof fn, "%s_train_step", name);
	void *stepf = dlsym(h, fn);
	snprintf(fn, sizeof fn, "%s_errmsg", name);
	const char *(*errmsg)(void *) = (const char *(*)(void *))dlsym(h, fn);
	ck_assert_ptr_nonnull(stepf);
	data d = load_data(name);
	kiln_model *cpu = open_lib(compiled(run, "llvm"));
	double worst = 0;
	for (int s = 0; s < STEPS; s++) {
		kiln_tensor x = view(d.x, s), y = view(d.y, s);
		float loss = NAN;
		int rc = mlp_run ? ((step_sym)stepf)(ctx, x.shape[0], x.data, y.data, lr, &loss)
		                 : ((step_fixed)stepf)(ctx, x.data, y.data, lr, &loss);
		ck_assert_msg(rc == 0, "%s step %d on the GPU: %s", run, s, errmsg(ctx));
		double want = step(cpu, d, s, lr), rel = fabs(loss - want) / fabs(want);
		worst = fmax(worst, rel);
		ck_assert_msg(rel <= 1e-4, "%s step %d: GPU %.9g, CPU %.9g (rel %.3g > 1e-4)", run, s,
		              loss, want, rel);
	}
	/* the state, device to host, as a set like kiln_model_state's */
	snprintf(fn, sizeof fn, "%s_num_state", name);
	int n = ((int (*)(void))dlsym(h, fn))();
	snprintf(fn, sizeof fn, "%s_state_name", name);
	const char *(*sname)(int) = (const char *(*)(int))dlsym(h, fn);
	snprintf(fn, sizeof fn, "%s_get_state", name);
	int (*get)(void *, int, void *) = (int (*)(void *, int, void *))dlsym(h, fn);
	kiln_tensor_set *sc = kiln_model_state(cpu), *sg = kiln_tensor_set_new();
	for (int i = 0; i < n; i++) {
		kiln_tensor *t = kiln_tensor_clone(kiln_tensor_set_get(sc, sname(i)));
		ck_assert_ptr_nonnull(t);
		ck_assert_msg(get(ctx, i, t->data) == 0, "%s", errmsg(ctx));
		ck_assert_int_eq(kiln_tensor_set_add(sg, sname(i), t), KILN_OK);
		kiln_tensor_free(t);
	}
	int skipped;
	double sd = state_diff(sg, sc, run, &skipped);
	printf("%s on the GPU against the CPU library: losses within %.3g relative, state within "
	       "%.3g\n", run, worst, sd);
	ck_assert_msg(sd <= 1e-5, "%s: GPU state differs by %.3g > 1e-5", run, sd);
	kiln_tensor_set_free(sc), kiln_tensor_set_free(sg);
	kiln_model_free(cpu);
	free_data(d);
}

/* The CUDA libraries of the MLP's and the CNN's train steps (state on the
 * device) build and export the CPU training library's entry points plus
 * the state calls.  Without a driver _create_ex fails with inference's
 * message (and _create returns NULL), never a crash; on a GPU they train
 * as the CPU libraries do (gpu_matches_cpu; bench/gpu.sh runs this). */
START_TEST(cuda_training_libraries_build_and_train_or_say_why)
{
	static const char *const runs[] = {"mlp_adamw", "cnn_sgd"};
	static const double lrs[] = {0.01, 0.1};
	for (int r = 0; r < 2; r++) {
		char name[4], so[1300], fn[64];
		snprintf(name, sizeof name, "%.3s", runs[r]);
		kiln_graph *m = model(name, true), *e = model(name, false);
		snprintf(so, sizeof so, "%s/%s_cuda.so", so_dir("cuda_emu_train_test"), runs[r]);
		kiln_error err = {0};
		kiln_status st = kiln_compile_train(m, e, r ? &SGD : &ADAMW, name[0] == 'c' ? 16 : 0, so,
		                                    &(kiln_compile_opts){.name = name, .target = "cuda"},
		                                    &err);
		ck_assert_msg(st == KILN_OK, "%s: %s", runs[r], err.msg);
		kiln_graph_free(m), kiln_graph_free(e);
		/* its header declares what it exports, and compiles warning-free */
		char cmd[3000], out[4096], hdr[1300];
		snprintf(hdr, sizeof hdr, "%.*s.h", (int)strlen(so) - 3, so);
		snprintf(cmd, sizeof cmd, "printf '#include \"%s\"\\nint main(void) { return "
		         "%s_num_state() > 0 ? 0 : 1; }\\n' | cc -std=c11 -Wall -Wextra -Werror "
		         "-fsyntax-only -x c -", hdr, name);
		ck_assert_msg(sh(cmd, out, sizeof out) == 0, "%s: %s", hdr, out);
		/* kiln_load runs CPU and emulated libraries, and says so */
		kiln_model *km = NULL;
		ck_assert_int_eq(kiln_load(so, &km, &err), KILN_EUNSUPPORTED);
		ck_assert_msg(strstr(err.msg, "a CUDA library") && strstr(err.msg, "_train_step"), "%s",
		              err.msg);
		void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
		ck_assert_msg(h, "%s", dlerror());
		static const char *const entries[] = {
			"create", "create_ex", "train_step", "eval_step", "steps", "micro", "set_counters",
			"num_state", "state_name", "state_bytes", "get_state", "set_state", "errmsg",
			"set_threads", "destroy"};
		for (size_t i = 0; i < sizeof entries / sizeof *entries; i++) {
			snprintf(fn, sizeof fn, "%s_%s", name, entries[i]);
			ck_assert_msg(dlsym(h, fn), "%s is not exported", fn);
		}
		snprintf(fn, sizeof fn, "%s_num_state", name);
		int (*num_state)(void) = (int (*)(void))dlsym(h, fn);
		snprintf(fn, sizeof fn, "%s_state_name", name);
		const char *(*state_name)(int) = (const char *(*)(int))dlsym(h, fn);
		snprintf(fn, sizeof fn, "%s_state_bytes", name);
		int64_t (*state_bytes)(int) = (int64_t (*)(int))dlsym(h, fn);
		/* MLP + AdamW: 4 parameters with exp_avg and exp_avg_sq; CNN + SGD
		 * momentum: 6 parameters with momentum buffers, bn1's 3 buffers */
		ck_assert_int_eq(num_state(), r ? 15 : 12);
		ck_assert_str_eq(state_name(0), r ? "conv1.weight" : "fc1.weight");
		ck_assert_int_eq(state_bytes(0), r ? 4 * 9 * 4 : 32 * 64 * 4);
		ck_assert_ptr_null(state_name(num_state()));
		snprintf(fn, sizeof fn, "%s_create_ex", name);
		int (*create_ex)(void **, char *, size_t) = (int (*)(void **, char *, size_t))dlsym(h, fn);
		snprintf(fn, sizeof fn, "%s_create", name);
		void *(*create)(void) = (void *(*)(void))dlsym(h, fn);
		snprintf(fn, sizeof fn, "%s_destroy", name);
		void (*destroy)(void *) = (void (*)(void *))dlsym(h, fn);
		void *ctx = (void *)1;
		char msg[600] = "";
		int rc = create_ex(&ctx, msg, sizeof msg);
		if (rc != 0) {
			ck_assert_ptr_null(ctx);
			ck_assert_msg(rc == KILN_EUNSUPPORTED || rc == KILN_EIO, "status %d", rc);
			ck_assert_msg(strstr(msg, "libcuda.so.1 not found") || strstr(msg, "CUDA: "), "%s",
			              msg);
			ck_assert_ptr_null(create());
			destroy(NULL);
			printf("%s: CUDA training library without a GPU: _create_ex -> %d: %s\n", runs[r],
			       rc, msg);
		} else {
			gpu_matches_cpu(h, ctx, runs[r], lrs[r]);
			destroy(ctx);
		}
		dlclose(h);
		unlink(so), unlink(hdr);
	}
}
END_TEST

static Suite *cuda_emu_train_suite(void)
{
	Suite *s = suite_create("cuda_emu_train");
	TCase *tc = tcase_create("cuda_emu_train");
	tcase_set_timeout(tc, 900);
	tcase_add_test(tc, mlp_sgd_momentum_emulated_matches_cpu);
	tcase_add_test(tc, mlp_adamw_emulated_matches_cpu);
	tcase_add_test(tc, cnn_sgd_momentum_emulated_matches_cpu);
	tcase_add_test(tc, cnn_adamw_emulated_matches_cpu);
	tcase_add_test(tc, checkpoint_from_emulated_library_loads_into_cpu_library);
	if (cg_nvrtc_available()) {
		tcase_add_test(tc, train_programs_compile_with_nvrtc);
		tcase_add_test(tc, cuda_training_libraries_build_and_train_or_say_why);
	}
	else
		printf("NVRTC checks skipped: this kiln was built without the CUDA toolkit\n");
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(cuda_emu_train_suite)
