/*
 * mlp.c: trace a three-layer MLP for 28x28 digits, summarise it, and run a
 * batch through kiln's reference interpreter.
 *
 *     ./mlp              # trace, print the summary and .kir, run 4 samples
 *     ./mlp mlp.kir      # ... and save the graph (mlp.kir + mlp.safetensors)
 *
 * The batch dimension is symbolic (N), so the one traced graph runs any
 * batch size.  The weights are PyTorch's default initialisation from a
 * seeded generator; kiln_graph_load_params would load trained ones from a
 * state_dict saved as safetensors (see tests/fixtures/make_model_fixtures.py).
 */
#include <stdio.h>

#include "kiln/kiln.h"
#include "models.h"

int main(int argc, char **argv)
{
	kiln_graph *g = kiln_graph_new("mlp");
	if (!g)
		return 1;
	kiln_graph_seed(g, 1);
	int64_t N = kiln_sym(g, "N");
	const int64_t dims[] = {N, 784}; /* a compound literal would split the macro args */
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, dims);
	kiln_output(g, "logits", example_mlp(g, x));
	if (kiln_graph_status(g) != KILN_OK) { /* the first error, with our file:line */
		fprintf(stderr, "mlp: %s\n", kiln_graph_errmsg(g));
		kiln_graph_free(g);
		return 1;
	}
	example_summary(g);

	kiln_error err = {0};
	kiln_tensor *in = example_random_input(2, (int64_t[]){4, 784}, 42), *out = NULL;
	kiln_status st = kiln_graph_run(g, &in, 1, &out, 1, &err);
	if (st == KILN_OK)
		example_print_logits(out);
	if (st == KILN_OK && argc > 1 && (st = kiln_graph_save(g, argv[1], &err)) == KILN_OK)
		printf("saved %s\n", argv[1]);
	if (st != KILN_OK)
		fprintf(stderr, "mlp: %s\n", err.msg);
	kiln_tensor_free(in);
	kiln_tensor_free(out);
	kiln_graph_free(g);
	return st == KILN_OK ? 0 : 1;
}
