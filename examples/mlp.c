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
	/* a failing builder records its error (with this file:line) in g and
	 * returns KILN_NONE, so tracing needs no checks; example_run checks
	 * kiln_graph_status once before running */
	int rc = example_run("mlp", g, 2, (int64_t[]){4, 784}, argc > 1 ? argv[1] : NULL);
	kiln_graph_free(g);
	return rc;
}
