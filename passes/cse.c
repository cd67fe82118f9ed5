/*
 * cse.c: the `cse` pass, hash-based common-subexpression elimination.
 *
 * Two nodes compute the same thing when they have the same op, the same
 * operands (as a multiset for IR_COMM ops: add %a, %b equals add %b, %a)
 * and the same attributes (compared by kind and exact value: floats by
 * bits, tensors by bytes, in any order).  One forward sweep keeps a hash
 * table of the nodes seen so far; a node equal to an earlier one has its
 * outputs redirected to the earlier node's and is removed.  Because the
 * earlier node comes first in the schedule, the order stays valid, and
 * because later nodes are hashed after their operands were redirected,
 * whole duplicated chains collapse in the same sweep.
 *
 * Random ops are never merged (two Dropouts are two draws), and a node
 * whose output is a graph output is kept: merging it would give two
 * outputs one value, and an output's name is part of the graph's interface.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdULL;
}

static uint64_t bytes_hash(const void *p, size_t n)
{
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
	return h;
}

static size_t tensor_bytes(const kiln_tensor *t)
{
	return kiln_tensor_nbytes(t);
}

static uint64_t attr_hash(const ir_attr *a)
{
	uint64_t h = mix(bytes_hash(a->name, strlen(a->name)), a->kind);
	switch (a->kind) {
	case IR_A_INT:
	case IR_A_DTYPE: return mix(h, (uint64_t)a->u.i);
	case IR_A_FLOAT: return mix(h, bytes_hash(&a->u.f, sizeof a->u.f));
	case IR_A_INTS: return mix(h, bytes_hash(a->u.ints, a->n * sizeof *a->u.ints));
	case IR_A_FLOATS: return mix(h, bytes_hash(a->u.floats, a->n * sizeof *a->u.floats));
	case IR_A_STRING: return mix(h, bytes_hash(a->u.s, strlen(a->u.s)));
	case IR_A_TENSOR: return mix(h, bytes_hash(a->u.t->data, tensor_bytes(a->u.t)));
	}
	return h;
}

static bool tensor_eq(const kiln_tensor *a, const kiln_tensor *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return memcmp(a->data, b->data, tensor_bytes(a)) == 0;
}

static bool attr_eq(const ir_attr *a, const ir_attr *b)
{
	if (a->kind != b->kind || strcmp(a->name, b->name) != 0)
		return false;
	switch (a->kind) {
	case IR_A_INT:
	case IR_A_DTYPE: return a->u.i == b->u.i;
	case IR_A_FLOAT: return memcmp(&a->u.f, &b->u.f, sizeof a->u.f) == 0;
	case IR_A_INTS:
		return a->n == b->n && a->dims == b->dims &&
		       memcmp(a->u.ints, b->u.ints, a->n * sizeof *a->u.ints) == 0;
	case IR_A_FLOATS:
		return a->n == b->n &&
		       memcmp(a->u.floats, b->u.floats, a->n * sizeof *a->u.floats) == 0;
	case IR_A_STRING: return strcmp(a->u.s, b->u.s) == 0;
	case IR_A_TENSOR: return tensor_eq(a->u.t, b->u.t);
	}
	return false;
}

/* Attributes as sets: the same names with equal values, in any order. */
static bool attrs_eq(const ir_node *a, const ir_node *b)
{
	if (a->nattr != b->nattr)
		return false;
	for (uint32_t i = 0; i < a->nattr; i++) {
		const ir_attr *o = ir_attr_get(b, a->attr[i].name);
		if (!o || !attr_eq(&a->attr[i], o))
			return false;
	}
	return true;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* n's operands in canonical order into key[] (nin entries). */
static void operands(const ir_node *n, uint32_t *key)
{
	memcpy(key, n->in, n->nin * sizeof *key);
	if (ir_op(n->op)->flags & IR_COMM)
		qsort(key, n->nin, sizeof *key, cmp_u32);
}

static uint64_t node_hash(const ir_node *n, uint32_t *key)
{
	uint64_t h = mix(mix(0, n->op), n->nout);
	operands(n, key);
	for (uint32_t i = 0; i < n->nin; i++)
		h = mix(h, key[i]);
	uint64_t ah = 0; /* order-independent: attributes are a set */
	for (uint32_t i = 0; i < n->nattr; i++)
		ah += attr_hash(&n->attr[i]);
	return mix(h, ah);
}

/* Equal outputs types too: a stale type must not hide behind a merge. */
static bool same(const kiln_graph *g, const ir_node *a, const ir_node *b, uint32_t *ka,
                 uint32_t *kb)
{
	if (a->op != b->op || a->nin != b->nin || a->nout != b->nout || !attrs_eq(a, b))
		return false;
	operands(a, ka);
	operands(b, kb);
	if (memcmp(ka, kb, a->nin * sizeof *ka) != 0)
		return false;
	for (uint32_t k = 0; k < a->nout; k++)
		if (!ir_type_eq(&g->val[a->out[k]]->type, &g->val[b->out[k]]->type))
			return false;
	return true;
}


/* A node that defines a graph output stays (it may still absorb later
 * duplicates); random nodes neither absorb nor are absorbed. */
static bool defines_output(const kiln_graph *g, const ir_node *n)
{
	for (uint32_t k = 0; k < n->nout; k++)
		if (pass_is_output(g, n->out[k]))
			return true;
	return false;
}

typedef struct table {
	ir_node **slot;
	uint64_t *hash;
	uint32_t mask;
	uint32_t *ka, *kb; /* operand scratch, max arity */
} table;

static kiln_status table_init(kiln_graph *g, table *t)
{
	uint32_t cap = 16, maxin = 1;
	while (cap < 2 * g->nnode)
		cap *= 2;
	for (uint32_t i = 0; i < g->nnode; i++)
		if (g->node[i]->nin > maxin)
			maxin = g->node[i]->nin;
	t->mask = cap - 1;
	t->slot = calloc(cap, sizeof *t->slot);
	t->hash = calloc(cap, sizeof *t->hash);
	t->ka = calloc(2 * (size_t)maxin, sizeof *t->ka);
	t->kb = t->ka ? t->ka + maxin : NULL;
	if (!t->slot || !t->hash || !t->ka)
		return ir_errorf(g, NULL, KILN_ENOMEM, "cse: out of memory");
	return KILN_OK;
}

static void table_free(table *t)
{
	free(t->slot);
	free(t->hash);
	free(t->ka);
}

/* The earlier node equal to n, or NULL after inserting n. */
static ir_node *lookup(const kiln_graph *g, table *t, ir_node *n)
{
	uint64_t h = node_hash(n, t->ka);
	uint32_t i = (uint32_t)h & t->mask;
	for (; t->slot[i]; i = (i + 1) & t->mask)
		if (t->hash[i] == h && same(g, t->slot[i], n, t->kb, t->ka))
			return t->slot[i];
	t->slot[i] = n;
	t->hash[i] = h;
	return NULL;
}

kiln_status pass_cse(kiln_graph *g, const pass_opts *o)
{
	table t = {0};
	if (table_init(g, &t) != KILN_OK) {
		table_free(&t);
		return g->status;
	}
	for (uint32_t i = 0; i < g->nnode && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (n->dead || (ir_op(n->op)->flags & IR_RANDOM))
			continue;
		ir_node *m = lookup(g, &t, n);
		if (!m || defines_output(g, n))
			continue;
		for (uint32_t k = 0; k < n->nout; k++)
			ir_replace_uses(g, n->out[k], m->out[k]);
		ir_node_remove(g, n);
	}
	table_free(&t);
	if (g->status != KILN_OK)
		return g->status;
	return ir_compact(g);
}
