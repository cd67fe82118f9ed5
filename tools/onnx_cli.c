/*
 * onnx_cli.c: the ONNX side of the `kiln` CLI: `kiln export` (optionally
 * with trained weights from a checkpoint), and the import that `kiln
 * inspect MODEL.onnx` uses to list every problem at once.
 *
 * The importer does not stop at the first unsupported node: it collects one
 * line per problem (node, op, domain, opset, what) into the report that
 * kiln_onnx_opts.report asks for.  `inspect` is where users go to learn
 * what a model needs, so it prints that whole report on stdout, not just
 * the 1 KiB kiln_error holds, and then the usual single "kiln: error:"
 * line on stderr.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "tools/tools.h"

const char cmd_export_summary[] = "write a .kir or .onnx graph as an ONNX model (opset 17)";
const char cmd_export_usage[] =
	"export FILE.kir|FILE.onnx [--weights CKPT.safetensors] -o OUT.onnx\n"
	"  Writes the graph as an ONNX model (IR version 8, opset 17) that\n"
	"  onnx.checker and ONNX Runtime accept: parameters become initializers\n"
	"  under their names, symbolic dims become dim_params, Gelu becomes its Erf\n"
	"  (or Tanh) formula.  Weights of FILE.kir load from FILE.safetensors beside\n"
	"  it.  The file is replaced atomically.\n"
	"  -o, --output OUT.onnx   the model to write\n"
	"  --weights CKPT          a training checkpoint (kiln train, kiln_trainer_save,\n"
	"                          a compiled library's _save): FILE's parameters and\n"
	"                          BatchNorm buffers are loaded from it by name;\n"
	"                          optimizer state and counters are ignored; a\n"
	"                          training-mode export is written as its inference\n"
	"                          model (running stats, Dropout off)";

/* Lines in a report ("a\nb\n" has 2). */
static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* `kiln inspect MODEL.onnx`: 0 with the imported graph in *g, or 1 after
 * printing every problem of the model (one per line, on stdout) and one
 * "kiln: error:" line saying how many (on stderr). */
int onnx_cli_inspect_report(const char *path, kiln_graph **g)
{
	char *report = NULL;
	kiln_error err = {0};
	kiln_onnx_opts o = {path, NULL, &report, NULL};
	*g = NULL;
	kiln_status st = kiln_onnx_import_ex(NULL, 0, &o, g, &err);
	if (st == KILN_OK) {
		free(report);
		return 0;
	}
	int n = report ? count_lines(report) : 0;
	if (n > 1) {
		printf("%s: %d problems; kiln cannot import this model until each is solved:\n%s",
		       path, n, report);
		tool_fail(1, "%s: %d problems importing the model (listed above)", path, n);
	} else {
		tool_fail_err(path, &err, st);
	}
	free(report);
	return 1;
}

#define SEE " (see 'kiln export --help')"

/* "-o F", "--output F", "--output=F" (and the same for --weights) into
 * *val: 1 taken, 0 not this option, -1 a usage error (reported). */
static int file_opt(int argc, char **argv, int *i, const char *lng, const char *shrt,
                    const char **val)
{
	const char *a = argv[*i];
	size_t n = strlen(lng);
	if (!strncmp(a, lng, n) && a[n] == '=') {
		*val = a + n + 1;
		return 1;
	}
	if (strcmp(a, lng) && (!shrt || strcmp(a, shrt)))
		return 0;
	if (*i + 1 == argc)
		return tool_fail(TOOLS_EXIT_USAGE, "option '%s' needs a file name" SEE, a), -1;
	*val = argv[++*i];
	return 1;
}

/* `kiln export FILE.kir|FILE.onnx [--weights CKPT] -o OUT.onnx`: see
 * cmd_export_usage. */
int cmd_export(int argc, char **argv)
{
	const char *in = NULL, *out = NULL, *weights = NULL;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		int k = file_opt(argc, argv, &i, "--output", "-o", &out);
		if (!k)
			k = file_opt(argc, argv, &i, "--weights", NULL, &weights);
		if (k < 0)
			return TOOLS_EXIT_USAGE;
		if (k > 0)
			continue;
		if (a[0] == '-' && a[1]) {
			return tool_fail(TOOLS_EXIT_USAGE, "unknown option '%s'" SEE, a);
		} else if (in) {
			return tool_fail(TOOLS_EXIT_USAGE, "unexpected argument '%s'" SEE, a);
		} else {
			in = a;
		}
	}
	if (!in || !out)
		return tool_fail(TOOLS_EXIT_USAGE, "missing %s" SEE, !in ? "FILE.kir or FILE.onnx"
		                                                    : "-o OUT.onnx");
	char *side = files_model_sidecar(in);
	tool_file ins[] = {{"the model", in, NULL}, {"the model", side, " (its weights)"},
	                   {"--weights", weights, NULL}};
	int rc = files_check_clash(ins, 3, &(tool_file){"-o", out, NULL}, 1) ||
	         files_check_dest("-o", out, false);
	free(side);
	if (rc)
		return 1;
	kiln_graph *g = NULL;
	kiln_error err = {0};
	kiln_status st = kiln_graph_load_any(in, &g, &err);
	if (st == KILN_OK)
		st = kiln_graph_verify(g, &err);
	if (st == KILN_OK && weights && (st = kiln_graph_load_trained(g, weights, &err)) != KILN_OK) {
		kiln_graph_free(g);
		return tool_fail_err(weights, &err, st);
	}
	/* the trained model of a training-mode export is its inference model */
	kiln_graph *inf = NULL;
	if (st == KILN_OK && weights &&
	    (st = kiln_inference_graph_from_train(g, &inf, NULL, &err)) == KILN_OK) {
		kiln_graph_free(g);
		g = inf;
	}
	if (st == KILN_OK)
		st = kiln_onnx_export(g, out, &err);
	if (st == KILN_OK)
		printf("wrote %s\n", out);
	kiln_graph_free(g);
	return st == KILN_OK ? 0 : tool_fail_err(in, &err, st);
}
