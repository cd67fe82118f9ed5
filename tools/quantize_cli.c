/*
 * quantize_cli.c: `kiln quantize` and the --int8 options of `kiln compile`,
 * both through kiln_quantize (driver/quantize.c).
 *
 * The calibration options parse into a quant_cli that either command
 * fills; quant_cli_run loads the .npy files, maps them to the model's
 * inputs by name, quantizes and prints the per-layer report.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "tools/tools.h"

const char cmd_quantize_summary[] = "int8-quantize a model by calibration; writes a QDQ model";
const char cmd_quantize_usage[] =
	"quantize MODEL.onnx|FILE.kir --calib [NAME=]X.npy -o OUT.onnx|OUT.kir [options]\n"
	"  Calibrates the model on sample inputs (run through a compiled library),\n"
	"  writes the QDQ model ONNX Runtime's quantize_static would (u8 activations,\n"
	"  s8 weights per output channel, i32 biases around Conv, MatMul, Gemm,\n"
	"  residual Add and MaxPool; Relu/Clip absorbed), and prints per layer its\n"
	"  result's scale, saturation and error against f32 on the samples.\n"
	"  'kiln compile MODEL --int8 --calib X.npy' compiles that model instead.\n"
	"  --calib [NAME=]X.npy     samples for input NAME stacked along axis 0 (the\n"
	"                           input's rank, or one axis more); repeat per input;\n"
	"                           NAME may be left out for a one-input model\n"
	"  -o, --output OUT         .onnx: an ONNX model; else .kir (+ .safetensors)\n"
	"  --method M               minmax (default), percentile or entropy (KL)\n"
	"  --percentile P           percentile's share kept on each side (99.999)\n"
	"  --keep-float OP|NODE     leave that op type (Conv, Gemm...) or node in f32;\n"
	"                           repeatable\n"
	"  --per-tensor             one scale per weight instead of per channel\n"
	"  --samples N              use the first N samples of each X\n"
	"  --batch N                samples per calibration run (16)\n"
	"  --threads N              threads for the calibration runs (1)\n"
	"  --quiet                  no report";

static const char *const methods[] = {"minmax", "percentile", "entropy"};

int quant_cli_flag(const char *cmd, int argc, char **argv, int *i, quant_cli *q, bool all)
{
	const char *a = argv[*i], *v;
	double d;
	if (!strcmp(a, "--int8") && !all) {
		q->on = true;
		return 1;
	}
	if (!strcmp(a, "--per-tensor")) {
		q->o.per_tensor_weights = q->set = true;
		return 1;
	}
	if (all && !strcmp(a, "--quiet")) {
		q->quiet = true;
		return 1;
	}
	static const char *const takes[] = {"--calib", "--method", "--percentile", "--keep-float",
	                                    "--samples", "--batch", "--threads"};
	int k = 0, nk = (int)(sizeof takes / sizeof *takes);
	while (k < nk && !tool_is_opt(a, takes[k], NULL))
		k++;
	if (k == nk || (!all && k == 5)) /* compile's --batch is the train step's */
		return 0;
	if (!(v = tool_optval(argc, argv, i, takes[k], NULL)))
		return tool_fail(TOOLS_EXIT_USAGE, "option '%s' needs a value (see 'kiln %s --help')", a,
		                 cmd), -1;
	q->set = true;
	bool ok = true;
	switch (k) {
	case 0:
		if (q->ncalib == QUANT_CLI_MAX_INPUTS)
			return tool_fail(TOOLS_EXIT_USAGE, "more than %d --calib files",
			                 QUANT_CLI_MAX_INPUTS), -1;
		q->calib[q->ncalib++] = v;
		break;
	case 1: {
		int m = 0;
		while (m < 3 && strcmp(v, methods[m]))
			m++;
		ok = m < 3;
		q->o.method = (kiln_calib_method)m;
		break;
	}
	case 2:
		ok = tool_num(v, &q->o.percentile) && q->o.percentile > 50 && q->o.percentile <= 100;
		break;
	case 3:
		if (q->o.nkeep_float == QUANT_CLI_MAX_KEEP)
			return tool_fail(TOOLS_EXIT_USAGE, "more than %d --keep-float names",
			                 QUANT_CLI_MAX_KEEP), -1;
		q->keep[q->o.nkeep_float++] = v;
		q->o.keep_float = q->keep;
		break;
	default: /* --samples, --batch, --threads: whole numbers >= 1 */
		ok = tool_num(v, &d) && d >= 1 && d == floor(d) && d <= (k == 6 ? 256 : 1e12);
		if (ok && k == 4)
			q->samples = (int64_t)d;
		else if (ok && k == 5)
			q->o.batch = (int64_t)d;
		else if (ok)
			q->o.threads = (int)d;
	}
	if (!ok)
		return tool_fail(TOOLS_EXIT_USAGE, "bad value '%s' for %s (see 'kiln %s --help')", v,
		                 takes[k], cmd), -1;
	return 1;
}

/* The model input a --calib file feeds: NAME=, or the only input. */
static int input_index(const kiln_graph *g, const char *spec, const char **path)
{
	const char *eq = strchr(spec, '=');
	int n = kiln_graph_num_inputs(g);
	if (!eq) {
		*path = spec;
		if (n == 1)
			return 0;
		return tool_fail(1, "--calib %s: the model has %d inputs: name one as NAME=X.npy", spec,
		                 n), -1;
	}
	*path = eq + 1;
	for (int i = 0; i < n; i++) {
		const char *name = kiln_value_name(g, kiln_graph_input(g, i));
		if (name && strlen(name) == (size_t)(eq - spec) && !strncmp(name, spec, (size_t)(eq - spec)))
			return i;
	}
	return tool_fail(1, "--calib %s: the model has no input '%.*s'", spec, (int)(eq - spec), spec),
	       -1;
}

static void print_report(const kiln_quant_report *r)
{
	int nq = 0;
	for (int i = 0; i < r->nlayers; i++)
		nq += r->layers[i].quantized;
	printf("calibrated on %lld samples (%s): %d layers, %d with u8 results\n",
	       (long long)r->samples, methods[r->method], r->nlayers, nq);
	int w = 5;
	for (int i = 0; i < r->nlayers; i++)
		w = (int)strlen(r->layers[i].name) > w ? (int)strlen(r->layers[i].name) : w;
	printf("%-*s %-9s %-6s %-11s %4s  %-22s %7s %8s %12s\n", w, "layer", "op", "result", "scale",
	       "zp", "range", "sat%", "rel.err", "max.err");
	for (int i = 0; i < r->nlayers; i++) {
		const kiln_quant_layer *l = &r->layers[i];
		char range[64] = "", scale[32] = "", zp[16] = "", maxe[32];
		if (l->quantized) {
			snprintf(range, sizeof range, "[%.4g, %.4g]", l->lo, l->hi);
			snprintf(scale, sizeof scale, "%.5g", l->scale);
			snprintf(zp, sizeof zp, "%d", l->zero_point);
			snprintf(maxe, sizeof maxe, "%.2f steps", l->max_error);
		} else {
			snprintf(maxe, sizeof maxe, "%.4g", l->max_error);
		}
		printf("%-*s %-9s %-6s %-11s %4s  %-22s %7.3f %7.2f%% %12s\n", w, l->name, l->op,
		       l->quantized ? "u8" : "f32", scale, zp, range,
		       l->quantized ? 100 * l->saturation : 0.0, 100 * l->rel_error, maxe);
	}
	for (int i = 0; i < r->noutputs; i++) {
		const kiln_quant_output *o = &r->outputs[i];
		if (isnan(o->rel_error)) {
			printf("output '%s': not f32, not compared\n", o->name);
			continue;
		}
		printf("output '%s': rel.err %.3f%%, cosine %.6f", o->name, 100 * o->rel_error, o->cosine);
		if (!isnan(o->top1))
			printf(", top-1 agreement %.2f%%", 100 * o->top1);
		printf("\n");
	}
}

int quant_cli_run(quant_cli *q, const kiln_graph *g, kiln_graph **out, bool summary)
{
	kiln_tensor *files[QUANT_CLI_MAX_INPUTS] = {0}, views[QUANT_CLI_MAX_INPUTS];
	kiln_tensor *calib[QUANT_CLI_MAX_INPUTS] = {0};
	int n = kiln_graph_num_inputs(g), rc = 0;
	kiln_error e = {0};
	if (q->ncalib == 0)
		return tool_fail(TOOLS_EXIT_USAGE, "%s", "quantizing needs --calib X.npy");
	if (n > QUANT_CLI_MAX_INPUTS)
		return tool_fail(1, "the model has %d inputs; kiln quantize takes at most %d", n,
		                 QUANT_CLI_MAX_INPUTS);
	for (int i = 0; !rc && i < q->ncalib; i++) {
		const char *path;
		int k = input_index(g, q->calib[i], &path);
		if (k < 0) {
			rc = 1;
		} else if (files[k]) {
			rc = tool_fail(1, "--calib %s: input %d has a file already", q->calib[i], k);
		} else {
			kiln_status st = kiln_npy_read(path, &files[k], &e);
			rc = st == KILN_OK ? 0 : tool_fail_err(path, &e, st);
		}
	}
	for (int i = 0; !rc && i < n; i++) {
		if (!files[i]) {
			const char *name = kiln_value_name(g, kiln_graph_input(g, i));
			rc = tool_fail(1, "no --calib file for input '%s'", name ? name : "?");
			break;
		}
		views[i] = *files[i];
		if (q->samples && views[i].rank > 0 && views[i].shape[0] > q->samples)
			views[i].shape[0] = q->samples;
		calib[i] = &views[i];
	}
	kiln_quant_report *r = NULL;
	if (!rc) {
		kiln_status st = kiln_quantize(g, calib, n, &q->o, out, q->quiet ? NULL : &r, &e);
		rc = st == KILN_OK ? 0 : tool_fail_err(NULL, &e, st);
	}
	if (!rc && r && !summary) {
		print_report(r);
	} else if (!rc && r) {
		int nq = 0;
		for (int i = 0; i < r->nlayers; i++)
			nq += r->layers[i].quantized;
		fprintf(stderr, "kiln: int8: %d layers (%d with u8 results), calibrated on %lld samples "
		        "(%s)", r->nlayers, nq, (long long)r->samples, methods[r->method]);
		for (int i = 0; i < r->noutputs; i++)
			if (!isnan(r->outputs[i].rel_error))
				fprintf(stderr, "; '%s' cosine %.5f vs f32", r->outputs[i].name,
				        r->outputs[i].cosine);
		fprintf(stderr, "\n");
	}
	kiln_quant_report_free(r);
	for (int i = 0; i < QUANT_CLI_MAX_INPUTS; i++)
		kiln_tensor_free(files[i]);
	return rc;
}

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

int cmd_quantize(int argc, char **argv)
{
	const char *file = NULL, *out = NULL;
	quant_cli q = {0};
	for (int i = 0; i < argc; i++) {
		int f = quant_cli_flag("quantize", argc, argv, &i, &q, true);
		if (f < 0)
			return TOOLS_EXIT_USAGE;
		if (f > 0)
			continue;
		if (tool_is_opt(argv[i], "--output", "-o")) {
			if (!(out = tool_optval(argc, argv, &i, "--output", "-o")))
				return tool_fail(TOOLS_EXIT_USAGE, "option '%s' needs a value (see 'kiln "
				                 "quantize --help')", argv[i]);
		} else if (argv[i][0] == '-' && argv[i][1]) {
			return tool_fail(TOOLS_EXIT_USAGE, "unknown option '%s' (see 'kiln quantize "
			                 "--help')", argv[i]);
		} else if (file) {
			return tool_fail(TOOLS_EXIT_USAGE, "unexpected argument '%s' (see 'kiln quantize "
			                 "--help')", argv[i]);
		} else {
			file = argv[i];
		}
	}
	if (!file || !out || !q.ncalib)
		return tool_fail(TOOLS_EXIT_USAGE, "missing %s (see 'kiln quantize --help')",
		                 !file ? "MODEL" : !out ? "-o OUT" : "--calib X.npy");
	bool onnx = ends_with(out, ".onnx");
	char *side = onnx ? NULL : files_swap_ext(out, ".kir", ".safetensors");
	char *in_side = files_model_sidecar(file);
	tool_file ins[] = {{"the model", file, NULL}, {"the model", in_side, " (its weights)"}};
	tool_file outs[] = {{"-o", out, NULL}, {"-o", side, " (the weights written beside it)"}};
	int rc = files_check_clash(ins, 2, outs, onnx ? 1 : 2);
	for (int i = 0; !rc && i < (onnx ? 1 : 2); i++)
		rc = files_check_dest(outs[i].flag, outs[i].path, false);
	for (int i = 0; !rc && i < q.ncalib; i++) {
		const char *eq = strchr(q.calib[i], '=');
		tool_file c[] = {{"--calib", eq ? eq + 1 : q.calib[i], NULL}};
		rc = files_check_clash(c, 1, outs, onnx ? 1 : 2);
	}
	free(side), free(in_side);
	if (rc)
		return rc;
	kiln_graph *g = NULL, *qg = NULL;
	kiln_error e = {0};
	kiln_status st = kiln_graph_load_any(file, &g, &e);
	if (st != KILN_OK)
		return tool_fail_err(file, &e, st);
	rc = quant_cli_run(&q, g, &qg, false);
	if (!rc) {
		st = onnx ? kiln_onnx_export(qg, out, &e) : kiln_graph_save(qg, out, &e);
		rc = st == KILN_OK ? 0 : tool_fail_err(out, &e, st);
	}
	if (!rc) {
		fflush(stdout);
		fprintf(stderr, "kiln: wrote %s\n", out);
	}
	kiln_graph_free(g), kiln_graph_free(qg);
	return rc ? rc : files_finish_stdout();
}
