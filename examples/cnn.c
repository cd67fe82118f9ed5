/*
 * cnn.c: trace a small convolutional network for 1x28x28 images (two
 * conv-batchnorm-relu-pool blocks and a linear classifier, written as two
 * torch.nn.Sequential-style layer lists), summarise it, and run a batch
 * through kiln's reference interpreter.
 *
 *     ./cnn              # trace, print the summary and .kir, run 4 samples
 *     ./cnn cnn.kir      # ... and save the graph (cnn.kir + cnn.safetensors)
 *
 * The graph is traced in eval mode: BatchNorm uses its running statistics
 * and Dropout is the identity.  Parameters carry PyTorch's names
 * (features.0.weight, features.1.running_mean, classifier.2.bias ...), so a
 * trained PyTorch state_dict loads with kiln_graph_load_params.
 */
#include <stdio.h>

#include "kiln/kiln.h"
#include "models.h"

int main(int argc, char **argv)
{
	kiln_graph *g = kiln_graph_new("cnn");
	if (!g)
		return 1;
	kiln_graph_seed(g, 1);
	int64_t N = kiln_sym(g, "N");
	const int64_t dims[] = {N, 1, 28, 28}; /* a compound literal would split the macro args */
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, dims);
	kiln_output(g, "logits", example_cnn(g, x));
	/* a failing builder records its error (with this file:line) in g and
	 * returns KILN_NONE, so tracing needs no checks; example_run checks
	 * kiln_graph_status once before running */
	int rc = example_run("cnn", g, 4, (int64_t[]){4, 1, 28, 28}, argc > 1 ? argv[1] : NULL);
	kiln_graph_free(g);
	return rc;
}
