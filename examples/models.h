/*
 * models.h: the example models, shared by examples/ and tests/unit/.
 *
 * Each function traces one model on input x and returns its logits.  The
 * layer names follow the PyTorch modules in tests/fixtures/
 * make_model_fixtures.py, so those state_dicts load by name: the MLP uses
 * explicitly named layers (fc1.weight ...), the CNN two Sequentials
 * (features.0.weight, classifier.2.bias ...).
 *
 * Below the models are the few helpers both example programs use: a
 * summary of a traced graph, seeded random input, printing logits, and
 * example_run, the part of main() after tracing that the two share.  They
 * use only the public API, as a user's program would.
 */
#ifndef KILN_EXAMPLE_MODELS_H
#define KILN_EXAMPLE_MODELS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

/* x: f32[N,784] -> f32[N,10] */
static inline kiln_value example_mlp(kiln_graph *g, kiln_value x)
{
	kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 256, true));
	h = kiln_relu(g, kiln_linear(g, "fc2", h, 128, true));
	return kiln_linear(g, "fc3", h, 10, true);
}

/* x: f32[N,1,28,28] -> f32[N,10] */
static inline kiln_value example_cnn(kiln_graph *g, kiln_value x)
{
	const kiln_conv_opts k3 = {.kernel = {3, 3}, .pad = {1, 1}};
	const kiln_conv_opts pool2 = {.kernel = {2, 2}};
	const kiln_layer features[] = {
		{KILN_L_CONV2D, .n = 8, .conv = k3},
		{KILN_L_BATCHNORM},
		{KILN_L_RELU},
		{KILN_L_MAXPOOL2D, .conv = pool2},
		{KILN_L_CONV2D, .n = 16, .conv = k3},
		{KILN_L_BATCHNORM},
		{KILN_L_RELU},
		{KILN_L_MAXPOOL2D, .conv = pool2},
		{KILN_L_END},
	};
	const kiln_layer classifier[] = {
		{KILN_L_DROPOUT, .p = 0.25},
		{KILN_L_FLATTEN},
		{KILN_L_LINEAR, .n = 10},
		{KILN_L_END},
	};
	x = kiln_sequential(g, "features", x, features);
	return kiln_sequential(g, "classifier", x, classifier);
}

/* ---- helpers for the example programs ----------------------------------- */

/* Prints the parameter count and bytes, an op histogram and the .kir. */
static inline void example_summary(const kiln_graph *g)
{
	kiln_tensor_set *p = kiln_graph_params(g);
	long long nval = 0, nbytes = 0;
	for (int i = 0; p && i < p->count; i++) {
		nval += kiln_tensor_numel(p->items[i].tensor);
		nbytes += (long long)kiln_tensor_nbytes(p->items[i].tensor);
	}
	printf("graph %s: %d parameter tensors, %lld values, %lld bytes\n", kiln_graph_name(g),
	       p ? p->count : 0, nval, nbytes);
	kiln_tensor_set_free(p);
	char *kir = kiln_graph_to_kir(g);
	if (!kir)
		return;
	/* the op histogram, read off the .kir: node lines are "%y = op ..." */
	struct {
		char op[32];
		int n;
	} hist[64];
	int nh = 0;
	for (char *line = kir; line && *line;) {
		char *nl = strchr(line, '\n'), *eq = strstr(line, " = "), op[32] = "";
		if (eq && (!nl || eq < nl) && line[strspn(line, " ")] == '%' &&
		    sscanf(eq + 3, "%31[a-z_0-9]", op) == 1) {
			int k = 0;
			while (k < nh && strcmp(hist[k].op, op) != 0)
				k++;
			if (k == nh && nh < 64) {
				snprintf(hist[nh].op, sizeof hist[nh].op, "%s", op);
				hist[nh++].n = 0;
			}
			if (k < nh)
				hist[k].n++;
		}
		line = nl ? nl + 1 : NULL;
	}
	printf("ops:");
	for (int k = 0; k < nh; k++)
		printf(" %s x%d", hist[k].op, hist[k].n);
	printf("\n\n%s\n", kir);
	free(kir);
}

/* A tensor of uniform [0, 1) values from a fixed seed (xorshift64). */
static inline kiln_tensor *example_random_input(int rank, const int64_t *shape, uint64_t seed)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, shape);
	uint64_t s = seed * 2654435761u + 1;
	for (int64_t i = 0; t && i < kiln_tensor_numel(t); i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		((float *)t->data)[i] = (float)((s >> 40) * 0x1p-24);
	}
	return t;
}

/* Prints each row of [batch, classes] logits and its argmax. */
static inline void example_print_logits(const kiln_tensor *y)
{
	const float *v = y->data;
	for (int64_t r = 0; r < y->shape[0]; r++) {
		int64_t best = 0;
		printf("sample %lld:", (long long)r);
		for (int64_t c = 0; c < y->shape[1]; c++) {
			printf(" %7.4f", v[r * y->shape[1] + c]);
			if (v[r * y->shape[1] + c] > v[r * y->shape[1] + best])
				best = c;
		}
		printf("  -> class %lld\n", (long long)best);
	}
}

/* What both example programs do with their traced graph g: print its
 * summary, run a random batch of the given shape through the interpreter
 * and print the logits, then save g to save_kir (and the .safetensors
 * beside it) unless that is NULL.  Errors go to stderr after "prog: ".
 * Returns main's exit status; g stays the caller's to free. */
static inline int example_run(const char *prog, kiln_graph *g, int rank, const int64_t *shape,
                              const char *save_kir)
{
	if (kiln_graph_status(g) != KILN_OK) { /* the first error, with the model's file:line */
		fprintf(stderr, "%s: %s\n", prog, kiln_graph_errmsg(g));
		return 1;
	}
	example_summary(g);

	kiln_error err = {0};
	kiln_tensor *in = example_random_input(rank, shape, 42), *out = NULL;
	kiln_status st = kiln_graph_run(g, &in, 1, &out, 1, &err);
	if (st == KILN_OK)
		example_print_logits(out);
	if (st == KILN_OK && save_kir && (st = kiln_graph_save(g, save_kir, &err)) == KILN_OK)
		printf("saved %s\n", save_kir);
	if (st != KILN_OK)
		fprintf(stderr, "%s: %s\n", prog, err.msg);
	kiln_tensor_free(in);
	kiln_tensor_free(out);
	return st == KILN_OK ? 0 : 1;
}

#endif /* KILN_EXAMPLE_MODELS_H */
