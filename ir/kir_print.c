/*
 * kir_print.c: prints a graph as textual IR (.kir).
 *
 * The text is canonical, so that printing, parsing and printing again gives
 * the same bytes: attributes are sorted by name, every number is printed
 * with the fewest digits that read back to the same bits, unnamed values
 * are numbered %0, %1, ... in the order they are printed, and a name that
 * could be mistaken for a number or does not lex as a bare name is quoted.
 *
 *     graph @f(%x: f32[N,4]) -> (%y: f32[N,4]) {
 *       param %w: f32[4,4]
 *       %0 = matmul %x, %w : f32[N,4] loc("f.c":12)
 *       %y = relu %0 : f32[N,4]
 *       ret %y
 *     }
 *
 * Parameter data is not printed (kiln_graph_save writes it to safetensors);
 * constants are, in full.  A node's loc is printed when it points outside
 * IR text (a C file, a model): a location inside a .kir file is not, since
 * the printed text is itself the node's new location.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* ---- output buffer ------------------------------------------------------ */

typedef struct buf {
	char *s;
	size_t len, cap;
	bool oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(buf *b, const char *fmt, ...)
{
	if (b->oom)
		return;
	if (!b->s && !(b->s = malloc(b->cap = 4096))) {
		b->oom = true;
		return;
	}
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += n;
			return;
		}
		size_t nc = b->cap * 2 + n + 1;
		char *p = realloc(b->s, nc);
		if (!p) {
			b->oom = true;
			return;
		}
		b->s = p;
		b->cap = nc;
	}
}

/* ---- names -------------------------------------------------------------- */

static bool bare_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
}

/* A name prints bare when it lexes back as one name token: bare characters,
 * not all digits (that is an unnamed value's number) and not ending in ':'
 * (the lexer leaves a trailing ':' for the type that follows). */
static bool is_bare(const char *s)
{
	bool digits = true;
	size_t n = strlen(s);
	if (n == 0 || s[n - 1] == ':')
		return false;
	for (const char *p = s; *p; p++) {
		if (!bare_char(*p))
			return false;
		digits = digits && *p >= '0' && *p <= '9';
	}
	return !digits;
}

static void put_quoted(buf *b, const char *s)
{
	put(b, "\"");
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			put(b, "\\%c", *p);
		else if (*p == '\n')
			put(b, "\\n");
		else if (*p == '\t')
			put(b, "\\t");
		else if (*p < 0x20 || *p == 0x7f)
			put(b, "\\x%02x", *p);
		else
			put(b, "%c", *p);
	}
	put(b, "\"");
}

static void put_name(buf *b, char sigil, const char *s)
{
	put(b, "%c", sigil);
	if (is_bare(s))
		put(b, "%s", s);
	else
		put_quoted(b, s);
}

/* ---- numbers ------------------------------------------------------------ */

/* Shortest %g form (at most maxprec digits) that reads back as v; with
 * as_float, reading back goes through float, for f32/f16/bf16 data. */
static void fmt_real(char *out, size_t size, double v, int maxprec, bool as_float)
{
	if (isnan(v)) {
		snprintf(out, size, "nan");
		return;
	}
	if (isinf(v)) {
		snprintf(out, size, v < 0 ? "-inf" : "inf");
		return;
	}
	for (int p = 1; p <= maxprec; p++) {
		snprintf(out, size, "%.*g", p, v);
		if (as_float ? strtof(out, NULL) == (float)v : strtod(out, NULL) == v)
			return;
	}
}

/* Attribute floats always show they are floats: "1.0", not "1". */
static void put_float(buf *b, double v)
{
	char s[40];
	fmt_real(s, sizeof s, v, 17, false);
	bool marked = strpbrk(s, ".eEni") != NULL;
	put(b, "%s%s", s, marked ? "" : ".0");
}

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
	float f;
	if (e == 31)
		f = m ? NAN : INFINITY;
	else if (e == 0)
		f = ldexpf((float)m, -24); /* zero or subnormal */
	else
		f = ldexpf((float)(m | 1024), (int)e - 25);
	return sign ? -f : f;
}

static float bf16_to_float(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* Element i of t as text, in the form kir_parse.c reads back exactly. */
static void fmt_elem(char *s, size_t size, const kiln_tensor *t, int64_t i)
{
	const void *d = t->data;
	switch (t->dtype) {
	case KILN_F32: fmt_real(s, size, ((const float *)d)[i], 9, true); break;
	case KILN_F64: fmt_real(s, size, ((const double *)d)[i], 17, false); break;
	case KILN_F16: fmt_real(s, size, half_to_float(((const uint16_t *)d)[i]), 9, true); break;
	case KILN_BF16: fmt_real(s, size, bf16_to_float(((const uint16_t *)d)[i]), 9, true); break;
	case KILN_I8: snprintf(s, size, "%d", ((const int8_t *)d)[i]); break;
	case KILN_U8: snprintf(s, size, "%u", ((const uint8_t *)d)[i]); break;
	case KILN_I32: snprintf(s, size, "%d", ((const int32_t *)d)[i]); break;
	case KILN_I64: snprintf(s, size, "%lld", (long long)((const int64_t *)d)[i]); break;
	case KILN_BOOL: snprintf(s, size, "%d", ((const uint8_t *)d)[i] ? 1 : 0); break;
	default: snprintf(s, size, "?"); break;
	}
}

/* dense<i64[3]>[1, 2, 3] */
static void put_tensor(buf *b, const kiln_tensor *t)
{
	put(b, "dense<%s[", kiln_dtype_name(t->dtype));
	for (int i = 0; i < t->rank; i++)
		put(b, "%s%lld", i ? "," : "", (long long)t->shape[i]);
	put(b, "]>[");
	int64_t n = kiln_tensor_numel(t);
	for (int64_t i = 0; i < n && !b->oom; i++) {
		char s[48];
		fmt_elem(s, sizeof s, t, i);
		put(b, "%s%s", i ? ", " : "", s);
	}
	put(b, "]");
}

/* ---- types and attributes ----------------------------------------------- */

static void put_type(buf *b, const kiln_graph *g, const ir_type *t)
{
	put(b, "%s[", kiln_dtype_name(t->dtype));
	for (int i = 0; i < t->rank && i < KILN_MAX_RANK; i++) {
		char d[256];
		put(b, "%s%s", i ? "," : "", ir_dim_str(g, t->dim[i], d, sizeof d));
	}
	put(b, "]");
}

static void put_attr_value(buf *b, const kiln_graph *g, const ir_attr *a)
{
	switch (a->kind) {
	case IR_A_INT: put(b, "%lld", (long long)a->u.i); break;
	case IR_A_FLOAT: put_float(b, a->u.f); break;
	case IR_A_DTYPE: put(b, "%s", kiln_dtype_name((kiln_dtype)a->u.i)); break;
	case IR_A_STRING: put_quoted(b, a->u.s ? a->u.s : ""); break;
	case IR_A_TENSOR: put_tensor(b, a->u.t); break;
	case IR_A_INTS:
		put(b, "[");
		for (uint32_t i = 0; i < a->n; i++) {
			char d[256];
			if (!ir_attr_is_dim(a, i))
				put(b, "%s%lld", i ? "," : "", (long long)a->u.ints[i]);
			else if (ir_dim_str(g, a->u.ints[i], d, sizeof d)[0] >= '0' && d[0] <= '9')
				put(b, "%s(%s)", i ? "," : "", d); /* a dim read back starts with a symbol or ( */
			else
				put(b, "%s%s", i ? "," : "", d);
		}
		put(b, "]");
		break;
	case IR_A_FLOATS:
		put(b, "[");
		for (uint32_t i = 0; i < a->n; i++) {
			put(b, "%s", i ? "," : "");
			put_float(b, a->u.floats[i]);
		}
		put(b, "]");
		break;
	}
}

static int attr_cmp(const void *x, const void *y)
{
	const ir_attr *a = *(const ir_attr *const *)x, *b = *(const ir_attr *const *)y;
	return strcmp(a->name, b->name);
}

/* {a=1, b=[1,2]} sorted by name, so the text does not depend on the order
 * in which a builder happened to set them. */
static void put_attrs(buf *b, const kiln_graph *g, const ir_node *n)
{
	if (!n->nattr)
		return;
	const ir_attr **s = malloc(n->nattr * sizeof *s);
	if (!s) {
		b->oom = true;
		return;
	}
	for (uint32_t i = 0; i < n->nattr; i++)
		s[i] = &n->attr[i];
	qsort(s, n->nattr, sizeof *s, attr_cmp);
	put(b, " {");
	for (uint32_t i = 0; i < n->nattr; i++) {
		put(b, "%s%s=", i ? ", " : "", s[i]->name);
		put_attr_value(b, g, s[i]);
	}
	put(b, "}");
	free(s);
}

/* ---- values ------------------------------------------------------------- */

/* How each value prints: its name, or a number when it has none or when an
 * earlier value already printed under its name (duplicates would not parse
 * back).  Names are interned, so a pointer hash set finds duplicates. */
typedef struct printer {
	buf b;
	const kiln_graph *g;
	int64_t *num;        /* per value id: print number, or -1 for its name */
	const char **seen;   /* open-addressing set of names printed */
	uint32_t capseen;
	int64_t next;
} printer;

static bool claim_name(printer *p, const char *name)
{
	uint32_t h = (uint32_t)(((uintptr_t)name >> 4) * 2654435761u) & (p->capseen - 1);
	for (; p->seen[h]; h = (h + 1) & (p->capseen - 1))
		if (p->seen[h] == name)
			return false;
	p->seen[h] = name;
	return true;
}

static void number_value(printer *p, uint32_t id)
{
	const ir_value *v = ir_val(p->g, id);
	if (!v || p->num[id] != -2)
		return;
	p->num[id] = v->name && claim_name(p, v->name) ? -1 : p->next++;
}

static void put_value(printer *p, uint32_t id)
{
	const ir_value *v = ir_val(p->g, id);
	if (!v || v->kind == IR_V_NONE)
		put(&p->b, "%%<dead>");
	else if (p->num[id] >= 0)
		put(&p->b, "%%%lld", (long long)p->num[id]);
	else
		put_name(&p->b, '%', v->name);
}

static void put_decl(printer *p, uint32_t id)
{
	put_value(p, id);
	put(&p->b, ": ");
	put_type(&p->b, p->g, &p->g->val[id]->type);
}

/* Numbers values in print order: inputs, parameters, node results. */
static bool number_all(printer *p)
{
	const kiln_graph *g = p->g;
	p->capseen = 16;
	while (p->capseen < 2 * g->nval)
		p->capseen *= 2;
	p->num = malloc(g->nval * sizeof *p->num);
	p->seen = calloc(p->capseen, sizeof *p->seen);
	if (!p->num || !p->seen)
		return false;
	for (uint32_t i = 0; i < g->nval; i++)
		p->num[i] = -2; /* not yet seen */
	for (uint32_t i = 0; i < g->ninput; i++)
		number_value(p, g->input[i]);
	for (uint32_t i = 1; i < g->nval; i++)
		if (g->val[i]->kind == IR_V_PARAM)
			number_value(p, i);
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead)
			for (uint32_t j = 0; j < g->node[i]->nout; j++)
				number_value(p, g->node[i]->out[j]);
	return true;
}

/* ---- graph -------------------------------------------------------------- */

/* Locations inside IR text are not printed; see the comment at the top. */
static bool loc_printed(kiln_loc loc)
{
	if (!loc.file || !*loc.file || loc.file[0] == '<')
		return false;
	size_t n = strlen(loc.file);
	return !(n >= 4 && strcmp(loc.file + n - 4, ".kir") == 0);
}

static void put_node(printer *p, const ir_node *n)
{
	const kiln_graph *g = p->g;
	put(&p->b, "  ");
	for (uint32_t i = 0; i < n->nout; i++) {
		put(&p->b, i ? ", " : "");
		put_value(p, n->out[i]);
	}
	put(&p->b, " = %s", ir_op(n->op)->kir);
	for (uint32_t i = 0; i < n->nin; i++) {
		put(&p->b, i ? ", " : " ");
		put_value(p, n->in[i]);
	}
	put_attrs(&p->b, g, n);
	put(&p->b, " :");
	for (uint32_t i = 0; i < n->nout; i++) {
		put(&p->b, i ? ", " : " ");
		put_type(&p->b, g, &g->val[n->out[i]]->type);
	}
	if (n->name) {
		put(&p->b, " name(");
		put_quoted(&p->b, n->name);
		put(&p->b, ")");
	}
	if (loc_printed(n->loc)) {
		put(&p->b, " loc(");
		put_quoted(&p->b, n->loc.file);
		put(&p->b, ":%d)", n->loc.line);
	}
	put(&p->b, "\n");
}

static void put_header(printer *p)
{
	const kiln_graph *g = p->g;
	put(&p->b, "graph ");
	put_name(&p->b, '@', g->name ? g->name : "main");
	put(&p->b, "(");
	for (uint32_t i = 0; i < g->ninput; i++) {
		put(&p->b, i ? ", " : "");
		put_decl(p, g->input[i]);
	}
	put(&p->b, ") -> (");
	for (uint32_t i = 0; i < g->noutput; i++) {
		put(&p->b, i ? ", " : "");
		if (ir_val(g, g->output[i]))
			put_decl(p, g->output[i]);
		else
			put(&p->b, "%%<dead>");
	}
	put(&p->b, ") {\n");
}

static void put_body(printer *p)
{
	const kiln_graph *g = p->g;
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		if (v->kind != IR_V_PARAM)
			continue;
		put(&p->b, "  %s ", v->trainable ? "param" : "buffer");
		put_decl(p, i);
		put(&p->b, "\n");
	}
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead)
			put_node(p, g->node[i]);
	put(&p->b, "  ret");
	for (uint32_t i = 0; i < g->noutput; i++) {
		put(&p->b, i ? ", " : " ");
		put_value(p, g->output[i]);
	}
	put(&p->b, "\n}\n");
}

char *ir_print(const kiln_graph *g)
{
	if (!g)
		return NULL;
	printer p = {.g = g};
	if (number_all(&p)) {
		put_header(&p);
		put_body(&p);
	} else {
		p.b.oom = true;
	}
	free(p.num);
	free(p.seen);
	if (p.b.oom) {
		free(p.b.s);
		return NULL;
	}
	return p.b.s;
}
