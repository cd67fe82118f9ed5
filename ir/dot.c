/*
 * dot.c: a graph as Graphviz text (`kiln inspect --dot`, `kiln compile
 * --emit=dot`).
 *
 * One box per live node (its op, its name, and the parameters and
 * constants it reads, with their types: weights are part of the layer, as
 * Netron draws them, not nodes of their own); one ellipse per graph input
 * and output; one edge per value read, labelled with its type, symbols
 * included (f32[N,64,56,56]).  A caller may put nodes into clusters: the
 * compiler draws each kernel of the compiled library as one, so a fused
 * group (conv + bias + relu + residual add) is one box of boxes.
 *
 *     digraph "mlp" {
 *       v1 [shape=ellipse, label="x\nf32[N,784]"];
 *       n0 [label="MatMul\nfc1\nW f32[784,128]"];
 *       v1 -> n0 [label="f32[N,784]"];
 *       ...
 *     }
 *
 * Every string is quoted and escaped, so a hostile ONNX name cannot break
 * the file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* s inside a quoted Graphviz string: '"' and '\' escaped, control bytes
 * dropped (a "\n" in a label is the caller's line break, not the name's) */
static void put_esc(FILE *b, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(b, "\\%c", *p);
		else if (*p >= 0x20 && *p != 0x7f)
			fprintf(b, "%c", *p);
	}
}

static const char *type_of(const kiln_graph *g, const ir_value *v, char *tb, size_t size)
{
	return ir_type_str(g, &v->type, tb, size);
}

/* Fill colour by what the op costs: products blue, normalisation and
 * reductions green, data movement grey, the rest (elementwise) white. */
static const char *fill(kiln_op op)
{
	switch (op) {
	case KILN_OP_CONV: case KILN_OP_CONV_TRANSPOSE: case KILN_OP_MATMUL: case KILN_OP_GEMM:
		return "#cfe2f3";
	case KILN_OP_BATCH_NORM: case KILN_OP_LAYER_NORM: case KILN_OP_SOFTMAX:
	case KILN_OP_LOG_SOFTMAX: case KILN_OP_MAX_POOL: case KILN_OP_AVERAGE_POOL:
	case KILN_OP_GLOBAL_AVERAGE_POOL: case KILN_OP_REDUCE_SUM: case KILN_OP_REDUCE_MEAN:
	case KILN_OP_REDUCE_MAX:
		return "#d9ead3";
	case KILN_OP_RESHAPE: case KILN_OP_TRANSPOSE: case KILN_OP_CONCAT: case KILN_OP_SLICE:
	case KILN_OP_GATHER: case KILN_OP_FLATTEN: case KILN_OP_SQUEEZE: case KILN_OP_UNSQUEEZE:
	case KILN_OP_EXPAND: case KILN_OP_SPLIT:
		return "#eeeeee";
	default:
		return "#ffffff";
	}
}

/* A Constant node's result is drawn inside its readers' boxes, as a weight */
static bool is_const(const ir_value *v)
{
	return v && v->kind == IR_V_NODE && v->def && v->def->op == KILN_OP_CONSTANT;
}

static bool drawn(const ir_node *n)
{
	return !n->dead && n->op != KILN_OP_CONSTANT;
}

static void node_box(FILE *b, const kiln_graph *g, const ir_node *n, const char *indent)
{
	char tb[256];
	fprintf(b, "%sn%u [label=\"", indent, n->idx);
	put_esc(b, ir_op(n->op)->onnx ? ir_op(n->op)->onnx : ir_op(n->op)->kir);
	if (n->name) {
		fprintf(b, "\\n");
		put_esc(b, n->name);
	}
	for (uint32_t i = 0; i < n->nin; i++) {
		const ir_value *v = ir_val(g, n->in[i]);
		if (!v || (v->kind != IR_V_PARAM && !is_const(v)))
			continue;
		fprintf(b, "\\n");
		if (v->kind == IR_V_PARAM)
			put_esc(b, v->name ? v->name : "param");
		else
			fprintf(b, "const");
		fprintf(b, " ");
		put_esc(b, type_of(g, v, tb, sizeof tb));
	}
	fprintf(b, "\", fillcolor=\"%s\"];\n", fill(n->op));
}

char *ir_graph_dot(const kiln_graph *g, const int *cluster, const char *const *label,
                   int ncluster)
{
	char tb[256], *text = NULL;
	size_t len = 0;
	FILE *f = g ? open_memstream(&text, &len) : NULL;
	if (!f)
		return NULL;
	fprintf(f, "digraph \"");
	put_esc(f, g->name ? g->name : "graph");
	fprintf(f, "\" {\n\tgraph [rankdir=TB, fontname=\"Helvetica\", fontsize=11];\n"
	        "\tnode [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", "
	        "fontsize=10];\n\tedge [fontname=\"Helvetica\", fontsize=8, color=\"#555555\"];\n");
	for (uint32_t i = 0; i < g->ninput; i++) {
		const ir_value *v = ir_val(g, g->input[i]);
		if (!v)
			continue;
		fprintf(f, "\tv%u [shape=ellipse, fillcolor=\"#fff2cc\", label=\"", v->id);
		put_esc(f, v->name ? v->name : "input");
		fprintf(f, "\\n");
		put_esc(f, type_of(g, v, tb, sizeof tb));
		fprintf(f, "\"];\n");
	}
	/* clusters first (Graphviz draws a node in the first subgraph naming
	 * it), then the nodes in none */
	for (int c = 0; cluster && c < ncluster; c++) {
		bool any = false;
		for (uint32_t i = 0; i < g->nnode && !any; i++)
			any = drawn(g->node[i]) && cluster[i] == c;
		if (!any)
			continue;
		fprintf(f, "\tsubgraph cluster_%d {\n\t\tlabel=\"", c);
		put_esc(f, label && label[c] ? label[c] : "");
		fprintf(f, "\"; style=\"rounded,filled\"; fillcolor=\"#f8f8f8\"; color=\"#3d85c6\"; "
		        "fontname=\"Helvetica\"; fontsize=9;\n");
		for (uint32_t i = 0; i < g->nnode; i++)
			if (drawn(g->node[i]) && cluster[i] == c)
				node_box(f, g, g->node[i], "\t\t");
		fprintf(f, "\t}\n");
	}
	for (uint32_t i = 0; i < g->nnode; i++) {
		const ir_node *n = g->node[i];
		if (drawn(n) && (!cluster || cluster[i] < 0 || cluster[i] >= ncluster))
			node_box(f, g, n, "\t");
	}
	/* edges: each node input made by a node or a graph input */
	for (uint32_t i = 0; i < g->nnode; i++) {
		const ir_node *n = g->node[i];
		if (!drawn(n))
			continue;
		for (uint32_t k = 0; k < n->nin; k++) {
			const ir_value *v = ir_val(g, n->in[k]);
			if (!v)
				continue;
			if (is_const(v))
				continue;
			if (v->kind == IR_V_NODE && v->def)
				fprintf(f, "\tn%u -> n%u [label=\"", v->def->idx, n->idx);
			else if (v->kind == IR_V_INPUT)
				fprintf(f, "\tv%u -> n%u [label=\"", v->id, n->idx);
			else
				continue;
			put_esc(f, type_of(g, v, tb, sizeof tb));
			fprintf(f, "\"];\n");
		}
	}
	/* outputs: an ellipse each, fed by the node (or input) that makes it */
	for (uint32_t i = 0; i < g->noutput; i++) {
		const ir_value *v = ir_val(g, g->output[i]);
		if (!v)
			continue;
		fprintf(f, "\to%u [shape=ellipse, fillcolor=\"#fce5cd\", label=\"", i);
		put_esc(f, v->name ? v->name : "output");
		fprintf(f, "\\n");
		put_esc(f, type_of(g, v, tb, sizeof tb));
		fprintf(f, "\"];\n");
		if (v->kind == IR_V_NODE && v->def && !is_const(v))
			fprintf(f, "\tn%u -> o%u;\n", v->def->idx, i);
		else if (v->kind == IR_V_INPUT)
			fprintf(f, "\tv%u -> o%u;\n", v->id, i);
	}
		fprintf(f, "}\n");
	if (ferror(f) | fclose(f)) { /* out of memory */
		free(text);
		return NULL;
	}
	return text;
}

KILN_API char *kiln_graph_to_dot(const kiln_graph *g)
{
	return ir_graph_dot(g, NULL, NULL, 0);
}
