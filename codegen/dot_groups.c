/*
 * dot_groups.c: `kiln compile --emit=dot`: the compiled graph drawn with
 * each kernel of the library as a cluster around the graph nodes it
 * computes, so what fusion did is visible.
 *
 * A kernel records only the node it was lowered from; the nodes fused into
 * it are found from the buffers:
 *  - a node whose result has a buffer that some kernel stores into was
 *    folded into that kernel's stores (an activation or a residual Add in a
 *    conv's epilogue: the conv's kernel writes the Add's buffer);
 *  - a node whose result has no buffer at all was computed inside the
 *    kernels that read it (an elementwise chain inlined into its reader):
 *    it goes with its first reader.
 * Views (a Reshape's buffer aliasing its input's) resolve to the buffer
 * they alias, so a view goes with the kernel that wrote its bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

static int root(const cg_module *m, int b)
{
	for (int hops = 0; b >= 0 && b < m->nbuf && m->buf[b].alias >= 0 && hops < m->nbuf; hops++)
		b = m->buf[b].alias;
	return b;
}

/* writer[root(b)] = k for every buffer kernel k stores into (first wins) */
static void mark_writes(const cg_module *m, const cg_stmt *s, int k, int *writer)
{
	if (!s)
		return;
	int w = -1;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			mark_writes(m, s->items[i], k, writer);
		return;
	case CG_FOR: mark_writes(m, s->body, k, writer); return;
	case CG_IF:
		mark_writes(m, s->then_s, k, writer);
		mark_writes(m, s->else_s, k, writer);
		return;
	case CG_STORE: w = s->buf; break;
	case CG_GEMM: w = s->gemm ? s->gemm->c : -1; break;
	case CG_TRANSPOSE: w = s->tr ? s->tr->dst : -1; break;
	default: return;
	}
	w = root(m, w);
	if (w >= 0 && w < m->nbuf && writer[w] < 0)
		writer[w] = k;
}

char *cg_module_dot(const cg_module *m)
{
	const kiln_graph *g = m ? m->g : NULL;
	if (!g)
		return NULL;
	int nn = (int)g->nnode;
	int *cluster = malloc(sizeof *cluster * (size_t)(nn + 1));
	int *writer = malloc(sizeof *writer * (size_t)(m->nbuf + 1));
	int *bufof = malloc(sizeof *bufof * (size_t)(g->nval + 1)); /* value -> root buffer */
	const char **label = calloc((size_t)m->nkern + 1, sizeof *label);
	char **owned = calloc((size_t)m->nkern + 1, sizeof *owned);
	char *text = NULL;
	if (!cluster || !writer || !bufof || !label || !owned)
		goto done;
	for (int i = 0; i < nn; i++)
		cluster[i] = -1;
	for (int b = 0; b < m->nbuf; b++)
		writer[b] = -1;
	for (uint32_t v = 0; v < g->nval; v++)
		bufof[v] = -1;
	for (int b = 0; b < m->nbuf; b++)
		if (m->buf[b].value && m->buf[b].value < g->nval && bufof[m->buf[b].value] < 0)
			bufof[m->buf[b].value] = root(m, b);
	/* the kernels lowered from each node; a node lowered to several (an
	 * im2col and its GEMM, a guarded pair) is one cluster, the first's */
	for (int k = 0; k < m->nkern; k++) {
		const cg_kernel *kk = &m->kern[k];
		mark_writes(m, kk->body, k, writer);
		if (kk->node < (uint32_t)nn && cluster[kk->node] < 0)
			cluster[kk->node] = k;
		int c = kk->node < (uint32_t)nn ? cluster[kk->node] : k;
		if (!label[c]) {
			label[c] = kk->name;
		} else {
			size_t len = strlen(label[c]) + strlen(kk->name) + 4;
			char *s = malloc(len);
			if (!s)
				goto done;
			snprintf(s, len, "%s + %s", label[c], kk->name);
			free(owned[c]);
			owned[c] = s;
			label[c] = s;
		}
	}
	/* nodes with no kernel, readers before producers (reverse schedule) so
	 * an inlined chain follows its reader */
	for (int i = nn - 1; i >= 0; i--) {
		const ir_node *n = g->node[i];
		if (n->dead || cluster[i] >= 0 || n->op == KILN_OP_CONSTANT || !n->nout)
			continue;
		uint32_t v = n->out[0];
		int b = v < g->nval ? bufof[v] : -1;
		if (b >= 0) {
			if (writer[b] >= 0 && m->kern[writer[b]].node < (uint32_t)nn)
				cluster[i] = cluster[m->kern[writer[b]].node];
			continue;
		}
		const ir_value *val = ir_val(g, v);
		for (uint32_t u = 0; val && u < val->nuse && cluster[i] < 0; u++)
			if (val->uses[u] && !val->uses[u]->dead)
				cluster[i] = cluster[val->uses[u]->idx];
	}
	text = ir_graph_dot(g, cluster, label, m->nkern);
done:
	for (int k = 0; owned && k < m->nkern; k++)
		free(owned[k]);
	free(owned);
	free(label);
	free(bufof);
	free(writer);
	free(cluster);
	return text;
}
