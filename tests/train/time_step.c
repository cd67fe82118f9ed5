/*
 * time_step.c: the compiled train step of the parity CNN (test_train.c's:
 * conv1 Conv2d(1,4,3,p=1), BatchNorm2d, ReLU, MaxPool2d(2), Linear(64,10))
 * timed through its typed entry point, as time_step.sh runs it beside
 * PyTorch.  Usage: time_step OUT_DIR BATCH STEPS.  Prints one line:
 * "kiln B=<batch> median_ms=<m> p10_ms=<a> p90_ms=<b> compile_s=<c>".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + 1e-9 * t.tv_nsec;
}

static kiln_graph *cnn(bool training)
{
	kiln_graph *g = kiln_graph_new("cnn");
	kiln_graph_set_training(g, training);
	kiln_graph_seed(g, 1);
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 1, 8, 8});
	kiln_conv_opts c = {.kernel = {3, 3}, .pad = {1, 1}};
	kiln_value h = kiln_conv2d(g, "conv1", x, 4, &c, true);
	h = kiln_relu(g, kiln_batchnorm(g, "bn1", h, 0, 0));
	h = kiln_max_pool(g, h, &(kiln_conv_opts){.kernel = {2, 2}, .stride = {2, 2}});
	kiln_output(g, "logits", kiln_linear(g, "fc", kiln_flatten(g, h, 1), 10, true));
	return g;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

typedef void *(*create_fn)(void);
typedef int (*train_fn)(void *, const float *, const int64_t *, double, float *);

int main(int argc, char **argv)
{
	if (argc != 4)
		return fprintf(stderr, "usage: time_step OUT_DIR BATCH STEPS\n"), 2;
	int64_t B = atoll(argv[2]);
	int steps = atoi(argv[3]);
	char so[1024];
	snprintf(so, sizeof so, "%s/cnn_step_b%lld.so", argv[1], (long long)B);
	kiln_graph *t = cnn(true), *e = cnn(false);
	kiln_train_opts o = {.optim = KILN_OPT_SGD, .momentum = 0.9, .weight_decay = 5e-4,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	kiln_error err;
	double t0 = now();
	if (kiln_compile_train(t, e, &o, B, so, NULL, &err) != KILN_OK)
		return fprintf(stderr, "%s\n", err.msg), 1;
	double compile_s = now() - t0;
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	create_fn create = h ? (create_fn)dlsym(h, "cnn_create") : NULL;
	train_fn train = h ? (train_fn)dlsym(h, "cnn_train_step") : NULL;
	if (!create || !train)
		return fprintf(stderr, "cannot open %s\n", so), 1;
	void *ctx = create();
	float *x = malloc(B * 64 * sizeof *x), loss;
	int64_t *y = malloc(B * sizeof *y);
	for (int64_t i = 0; i < B * 64; i++)
		x[i] = (float)((i * 37) % 17) / 16.0f;
	for (int64_t i = 0; i < B; i++)
		y[i] = i % 10;
	double *ms = malloc(steps * sizeof *ms);
	for (int i = 0; i < 20; i++) /* warm-up */
		train(ctx, x, y, 0.01, &loss);
	for (int i = 0; i < steps; i++) {
		double s = now();
		train(ctx, x, y, 0.01, &loss);
		ms[i] = 1e3 * (now() - s);
	}
	qsort(ms, steps, sizeof *ms, cmp);
	printf("kiln B=%lld median_ms=%.4f p10_ms=%.4f p90_ms=%.4f compile_s=%.2f\n", (long long)B,
	       ms[steps / 2], ms[steps / 10], ms[steps * 9 / 10], compile_s);
	free(ms), free(x), free(y);
	kiln_graph_free(t), kiln_graph_free(e);
	return 0;
}
