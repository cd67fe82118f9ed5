/*
 * digits.c: the demo's model, written with kiln's C DSL: a small CNN for
 * sklearn's 8x8 digits, as one would write it in torch.nn.
 *
 *     ./digits digits.kir     # trace it and save digits.kir + .safetensors
 *
 *     features: Conv2d(1,16,3,pad 1) BatchNorm2d ReLU MaxPool2d(2)
 *               Conv2d(16,32,3,pad 1) BatchNorm2d ReLU
 *     classifier: Dropout(0.1) Flatten Linear(512,10)
 *
 * The parameters are initialised as torch.nn initialises them and named as
 * its state_dict names them (features.0.weight, features.1.running_var,
 * classifier.2.bias, ...).  The graph is traced in eval mode; `kiln train`
 * derives the training graph (batch statistics, Dropout on) from it.
 */
#include <stdio.h>

#include "kiln/kiln.h"

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OUT.kir\n", argv[0]);
		return 2;
	}
	kiln_graph *g = kiln_graph_new("digits");
	if (!g)
		return 1;
	kiln_graph_seed(g, 7);
	const int64_t dims[] = {kiln_sym(g, "N"), 1, 8, 8};
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, dims);
	const kiln_conv_opts k3 = {.kernel = {3, 3}, .pad = {1, 1}};
	const kiln_layer features[] = {
		{KILN_L_CONV2D, .n = 16, .conv = k3},
		{KILN_L_BATCHNORM},
		{KILN_L_RELU},
		{KILN_L_MAXPOOL2D, .conv = {.kernel = {2, 2}}},
		{KILN_L_CONV2D, .n = 32, .conv = k3},
		{KILN_L_BATCHNORM},
		{KILN_L_RELU},
		{KILN_L_END},
	};
	const kiln_layer classifier[] = {
		{KILN_L_DROPOUT, .p = 0.1},
		{KILN_L_FLATTEN},
		{KILN_L_LINEAR, .n = 10},
		{KILN_L_END},
	};
	x = kiln_sequential(g, "features", x, features);
	kiln_output(g, "logits", kiln_sequential(g, "classifier", x, classifier));
	/* a failing builder records its error (with this file:line) in g: one
	 * check after tracing */
	kiln_error err = {0};
	int rc = 0;
	if (kiln_graph_status(g) != KILN_OK) {
		fprintf(stderr, "digits: %s\n", kiln_graph_errmsg(g));
		rc = 1;
	} else if (kiln_graph_save(g, argv[1], &err) != KILN_OK) {
		fprintf(stderr, "digits: %s\n", err.msg);
		rc = 1;
	} else {
		int64_t n = 0;
		for (int i = 0; i < kiln_graph_num_params(g); i++) {
			kiln_value p = kiln_graph_param(g, i);
			if (kiln_param_trainable(g, p))
				n += kiln_tensor_numel(kiln_param_data(g, p));
		}
		printf("traced digits: x f32[N,1,8,8] -> logits f32[N,10], %lld trainable "
		       "parameters; saved %s\n", (long long)n, argv[1]);
	}
	kiln_graph_free(g);
	return rc;
}
