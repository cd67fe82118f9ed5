/*
 * pipeline.c: the pass registry and the driver that runs a pass list.
 *
 * A pipeline is a flat comma-separated list of pass names, as QBE's main
 * is a flat list of calls.  The driver checks every name before it runs
 * anything, runs the passes in order, stops at the first error (which the
 * pass recorded in the graph), and between passes runs the verifier (in
 * debug builds, or when asked) and prints the IR when --dump-after names the
 * pass, so a broken invariant is caught next to the pass that broke it.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

const pass_info pass_table[] = {
	{"infer", pass_infer, "re-run shape inference over every node"},
	{"fold", pass_fold, "evaluate nodes with constant inputs (not params) into constants"},
	{"cse", pass_cse, "merge nodes with the same op, inputs and attributes"},
	{"dce", pass_dce, "remove nodes no graph output depends on"},
	{"canonicalize", pass_canon, "drop identities, inference dropout, transpose and reshape chains"},
	{"nnfuse", pass_nnfuse, "replace decomposed LayerNorm and GELU (erf and tanh forms) by single ops; Pow by 2 or 3 by Muls"},
	{"qfuse", pass_qfuse, "turn DequantizeLinear -> Conv/MatMul/Gemm -> QuantizeLinear into integer ops (QLinearConv, QLinearMatMul)"},
	{"unroll_rnn", pass_unroll_rnn, "unroll fused RNN, GRU and LSTM nodes with a fixed sequence length into per-step ops (what autodiff differentiates)"},
	{"bnfold", pass_bnfold, "fold inference BatchNorm into the conv/gemm/matmul before it; store constant Linear weights K-by-N"},
};
const int pass_count = (int)(sizeof pass_table / sizeof pass_table[0]);

const pass_info *pass_find(const char *name)
{
	for (int i = 0; i < pass_count; i++)
		if (strcmp(pass_table[i].name, name) == 0)
			return &pass_table[i];
	return NULL;
}

/* "infer, fold, cse, dce" into buf, for messages. */
static const char *known(char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = 0;
	for (int i = 0; i < pass_count && n < size; i++)
		n += snprintf(buf + n, size - n, "%s%s", i ? ", " : "", pass_table[i].name);
	return buf;
}

/* Splits list into at most max registry entries, expanding "default". */
static int parse(const char *list, const pass_info **out, int max, kiln_error *err)
{
	int n = 0;
	const char *p = list;
	while (*p) {
		size_t len = strcspn(p, ",");
		char name[64];
		if (len >= sizeof name)
			len = sizeof name - 1;
		memcpy(name, p, len);
		name[len] = 0;
		p += strcspn(p, ",");
		if (*p == ',')
			p++;
		if (!name[0])
			continue; /* "fold,,dce" and a trailing comma are harmless */
		if (strcmp(name, "default") == 0) {
			int k = parse(PASS_DEFAULT, out + n, max - n, err);
			if (k < 0)
				return k;
			n += k;
			continue;
		}
		const pass_info *pi = pass_find(name);
		if (!pi) {
			char buf[256];
			ir_seterr(err, KILN_EINVAL, "unknown pass '%s' (known passes: %s, default)", name,
			          known(buf, sizeof buf));
			return -1;
		}
		if (n == max) {
			ir_seterr(err, KILN_EINVAL, "pass list longer than %d passes", max);
			return -1;
		}
		out[n++] = pi;
	}
	return n;
}

/* The graph's sticky error into err; returns its code. */
static kiln_status graph_err(const kiln_graph *g, kiln_error *err)
{
	return ir_seterr(err, g->status, "%s", g->errmsg);
}

static void dump(const kiln_graph *g, const char *pass, const pass_opts *o)
{
	FILE *f = o->dump ? o->dump : stderr;
	char *text = ir_print(g);
	fprintf(f, "# ---- IR after %s ----\n%s", pass, text ? text : "(out of memory)\n");
	free(text);
}

static kiln_status check(kiln_graph *g, const char *pass, kiln_error *err)
{
	kiln_error e = {0};
	if (ir_verify(g, &e) == KILN_OK)
		return KILN_OK;
	/* record in the graph too, so kiln_graph_status agrees with err */
	ir_errorf(g, NULL, KILN_EVERIFY, "after pass '%s': %s", pass, e.msg);
	return graph_err(g, err);
}

kiln_status pass_run_list(kiln_graph *g, const char *list, const pass_opts *o,
                          kiln_error *err)
{
	static const pass_opts dflt;
	const pass_info *run[64];
	if (!g)
		return ir_seterr(err, KILN_EINVAL, "optimize: null graph");
	if (!o)
		o = &dflt;
	int n = parse(list ? list : PASS_DEFAULT, run, 64, err);
	if (n < 0)
		return KILN_EINVAL;
	if (g->status != KILN_OK)
		return graph_err(g, err);
#ifdef KILN_DEBUG
	bool verify = true;
#else
	bool verify = o->verify;
#endif
	for (int i = 0; i < n; i++) {
		kiln_status st = run[i]->run(g, o);
		if (st != KILN_OK && g->status == KILN_OK)
			ir_errorf(g, NULL, st, "pass '%s' failed", run[i]->name);
		if (g->status != KILN_OK)
			return graph_err(g, err);
		/* dump before verifying: a broken graph is what one wants to see */
		if (o->dump_after && (strcmp(o->dump_after, "all") == 0 ||
		                      strcmp(o->dump_after, run[i]->name) == 0))
			dump(g, run[i]->name, o);
		if (verify && check(g, run[i]->name, err) != KILN_OK)
			return KILN_EVERIFY;
	}
	return KILN_OK;
}

KILN_API kiln_status kiln_graph_optimize(kiln_graph *g, const char *passes, kiln_error *err)
{
	return pass_run_list(g, passes, NULL, err);
}

/* ---- the registry and the pipeline through kiln.h ---------------------- */

KILN_API int kiln_pass_count(void)
{
	return pass_count;
}

KILN_API const char *kiln_pass_name(int i)
{
	return i >= 0 && i < pass_count ? pass_table[i].name : NULL;
}

KILN_API const char *kiln_pass_desc(int i)
{
	return i >= 0 && i < pass_count ? pass_table[i].desc : NULL;
}

KILN_API bool kiln_pass_known(const char *name)
{
	return name && pass_find(name) != NULL;
}

KILN_API const char *kiln_pass_default(void)
{
	return PASS_DEFAULT;
}

KILN_API kiln_status kiln_graph_run_passes(kiln_graph *g, const char *list,
                                           const kiln_pass_opts *o, kiln_error *err)
{
	pass_opts po = {0};
	if (o)
		po = (pass_opts){.verify = o->verify, .dump_after = o->dump_after, .dump = o->dump};
	return pass_run_list(g, list, &po, err);
}
