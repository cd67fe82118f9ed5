/*
 * kir_parse.c: reads textual IR (.kir) back into a graph.
 *
 * A hand-written recursive-descent parser over a one-token-lookahead lexer,
 * in the style of chibicc: the grammar rule sits above each function.  The
 * grammar does not depend on line breaks; every statement begins with a
 * token that tells which kind it is (param, buffer, ret, a value).
 *
 * The parser builds the graph as it goes and takes each result's type as
 * written: it never runs shape inference, so a .kir file can hold a graph
 * that inference would reject, and ir_verify (run by kiln_graph_from_kir)
 * is what compares written and inferred types.  Nodes get the .kir file and
 * line as their loc unless the text gives a loc(...).
 *
 * Every error is "file:line:col: expected X, found Y" and stops the parse.
 * The input is untrusted: the lexer never reads past the end, numbers are
 * range-checked, dimension arithmetic is checked for overflow before ir.c
 * folds it, the only recursion (dimension expressions) has a depth limit,
 * and memory is bounded by the text (dense tensors must list every element)
 * except parameters, whose zeroed data is capped at KIR_MAX_PARAM_BYTES.
 * Scratch lives in an arena freed when the parse ends.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

#define KIR_MAX_PARAM_BYTES ((uint64_t)4 << 30)
#define KIR_MAX_DEPTH 32

/* ---- lexer --------------------------------------------------------------- */

typedef enum {
	T_EOF,
	T_PUNCT,  /* ( ) { } [ ] < > , = : + * / - -> */
	T_VALUE,  /* %name or %"name" */
	T_GLOBAL, /* @name or @"name" */
	T_IDENT,  /* keywords, ops, dtypes, symbols, attribute names */
	T_INT,    /* -?[0-9]+ */
	T_FLOAT,  /* -?[0-9]+(.[0-9]*)?(e[+-]?[0-9]+)? with '.' or exponent */
	T_STRING, /* "..." with \" \\ \n \t \xHH */
} tkind;

typedef struct tok {
	tkind kind;
	const char *p; /* the token's text (for names: after the sigil) */
	size_t len;
	bool quoted;   /* T_VALUE, T_GLOBAL: the name is a string literal */
	int line, col;
} tok;

typedef struct name_slot {
	const char *key; /* "=name" for names, "#12" for numbered values */
	uint32_t id;
} name_slot;

typedef struct result {
	tok ref;          /* T_EOF when the signature gives only a type */
	ir_type type;
} result;

typedef struct parser {
	const char *cur, *end, *linestart;
	int line;
	const char *file;
	tok tk;
	bool failed;
	kiln_error err;
	kiln_graph *g;
	ir_arena *scratch;
	name_slot *names;   /* open-addressing table of defined values */
	uint32_t nnames, capnames;
	result *results;    /* the signature's outputs, checked at ret */
	uint32_t nresults;
	uint64_t param_bytes;
	int depth;
} parser;

static bool perr(parser *P, const tok *t, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Records the first error at t's position; always returns false. */
static bool perr(parser *P, const tok *t, const char *fmt, ...)
{
	if (P->failed)
		return false;
	P->failed = true;
	P->err.code = KILN_EPARSE;
	int n = snprintf(P->err.msg, sizeof P->err.msg, "%s:%d:%d: ", P->file, t->line, t->col);
	va_list ap;
	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < sizeof P->err.msg)
		vsnprintf(P->err.msg + n, sizeof P->err.msg - n, fmt, ap);
	va_end(ap);
	return false;
}

/* "'conv'" or "end of input", for "found ..." in messages. */
static const char *show(const tok *t, char *buf, size_t size)
{
	if (t->kind == T_EOF)
		return "end of input";
	const char *pre = t->kind == T_VALUE ? "%" : t->kind == T_GLOBAL ? "@" : "";
	const char *q = t->quoted || t->kind == T_STRING ? "\"" : "";
	int len = t->len > 40 ? 40 : (int)t->len;
	snprintf(buf, size, "'%s%s%.*s%s%s'", pre, q, len, t->p, t->len > 40 ? "..." : "", q);
	return buf;
}

static bool expected(parser *P, const char *what)
{
	char b[96];
	return perr(P, &P->tk, "expected %s, found %s", what, show(&P->tk, b, sizeof b));
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_name_char(char c)
{
	return is_alpha(c) || is_digit(c) || c == '.' || c == ':' || c == '/' || c == '-';
}

static void skip_space(parser *P)
{
	while (P->cur < P->end) {
		char c = *P->cur;
		if (c == '\n') {
			P->line++;
			P->linestart = ++P->cur;
		} else if (c == ' ' || c == '\t' || c == '\r') {
			P->cur++;
		} else if (c == '#') {
			while (P->cur < P->end && *P->cur != '\n')
				P->cur++;
		} else {
			break;
		}
	}
}

/* Scans a string literal starting at the opening quote; sets t's text to
 * the part between the quotes (escapes still in it). */
static bool lex_string(parser *P, tok *t)
{
	const char *p = P->cur + 1;
	for (; p < P->end && *p != '"' && *p != '\n'; p++)
		if (*p == '\\' && p + 1 < P->end && p[1] != '\n')
			p++;
	if (p >= P->end || *p != '"')
		return perr(P, t, "unterminated string");
	t->p = P->cur + 1;
	t->len = p - t->p;
	P->cur = p + 1;
	return true;
}

/* -?[0-9]+ ('.' [0-9]*)? ([eE] [+-]? [0-9]+)? */
static void lex_number(parser *P, tok *t)
{
	const char *p = P->cur + (*P->cur == '-');
	t->kind = T_INT;
	while (p < P->end && is_digit(*p))
		p++;
	if (p < P->end && *p == '.') {
		t->kind = T_FLOAT;
		for (p++; p < P->end && is_digit(*p);)
			p++;
	}
	if (p < P->end && (*p == 'e' || *p == 'E')) {
		const char *q = p + 1;
		if (q < P->end && (*q == '+' || *q == '-'))
			q++;
		if (q < P->end && is_digit(*q)) {
			t->kind = T_FLOAT;
			for (p = q; p < P->end && is_digit(*p);)
				p++;
		}
	}
	t->p = P->cur;
	t->len = p - P->cur;
	P->cur = p;
}

/* %name, @name, %"name": a bare name drops trailing ':' so "%x: f32" works */
static bool lex_name(parser *P, tok *t, tkind kind)
{
	t->kind = kind;
	P->cur++;
	if (P->cur < P->end && *P->cur == '"') {
		t->quoted = true;
		return lex_string(P, t);
	}
	const char *p = P->cur;
	while (p < P->end && is_name_char(*p))
		p++;
	while (p > P->cur && p[-1] == ':')
		p--;
	t->p = P->cur;
	t->len = p - P->cur;
	P->cur = p;
	if (t->len == 0)
		return perr(P, t, "expected a name after '%c'", kind == T_VALUE ? '%' : '@');
	return true;
}

static void next(parser *P)
{
	if (P->failed)
		return;
	skip_space(P);
	tok t = {.kind = T_EOF, .p = P->cur, .line = P->line,
	         .col = (int)(P->cur - P->linestart) + 1};
	const char *c = P->cur;
	if (c >= P->end) {
		P->tk = t;
		return;
	}
	if (*c == '%' || *c == '@') {
		lex_name(P, &t, *c == '%' ? T_VALUE : T_GLOBAL);
	} else if (*c == '"') {
		t.kind = T_STRING;
		lex_string(P, &t);
	} else if (is_digit(*c) || (*c == '-' && c + 1 < P->end && is_digit(c[1]))) {
		lex_number(P, &t);
	} else if (is_alpha(*c)) {
		while (P->cur < P->end && (is_alpha(*P->cur) || is_digit(*P->cur)))
			P->cur++;
		t.kind = T_IDENT;
		t.len = P->cur - c;
	} else if (strchr("(){}[]<>,=:+*/-", *c)) {
		t.kind = T_PUNCT;
		t.len = (*c == '-' && c + 1 < P->end && c[1] == '>') ? 2 : 1;
		P->cur += t.len;
	} else {
		unsigned char u = (unsigned char)*c;
		if (u >= 0x20 && u < 0x7f)
			perr(P, &t, "unexpected character '%c'", u);
		else
			perr(P, &t, "unexpected byte 0x%02x", u);
	}
	P->tk = t;
}

static bool tok_is(const tok *t, tkind kind, const char *s)
{
	return t->kind == kind && !t->quoted && t->len == strlen(s) && memcmp(t->p, s, t->len) == 0;
}

static bool at(parser *P, const char *punct)
{
	return tok_is(&P->tk, T_PUNCT, punct);
}

static bool at_kw(parser *P, const char *kw)
{
	return tok_is(&P->tk, T_IDENT, kw);
}

/* Consumes punct if it is next. */
static bool accept(parser *P, const char *punct)
{
	if (P->failed || !at(P, punct))
		return false;
	next(P);
	return true;
}

static bool expect(parser *P, const char *punct)
{
	if (P->failed)
		return false;
	if (accept(P, punct))
		return true;
	char what[16];
	snprintf(what, sizeof what, "'%s'", punct);
	return expected(P, what);
}

/* ---- literals ------------------------------------------------------------ */

/* The decoded text of a string or quoted name, in scratch; NULL on error. */
static char *unquote(parser *P, const tok *t)
{
	char *s = ir_alloc(P->scratch, t->len + 1), *o = s;
	if (!s)
		return perr(P, t, "out of memory"), NULL;
	for (const char *p = t->p, *e = t->p + t->len; p < e; p++) {
		if (*p != '\\') {
			*o++ = *p;
			continue;
		}
		char c = *++p;
		if (c == 'n' || c == 't' || c == '"' || c == '\\') {
			*o++ = c == 'n' ? '\n' : c == 't' ? '\t' : c;
		} else if (c == 'x' && e - p > 2 && strchr("0123456789abcdefABCDEF", p[1]) &&
		           strchr("0123456789abcdefABCDEF", p[2]) && p[1] && p[2]) {
			char hex[3] = {p[1], p[2], 0};
			*o = (char)strtol(hex, NULL, 16);
			if (!*o++)
				return perr(P, t, "string contains a NUL byte"), NULL;
			p += 2;
		} else {
			return perr(P, t, "bad escape '\\%c' in string", c ? c : '0'), NULL;
		}
	}
	*o = 0;
	return s;
}

/* Copies a number token into buf; false if it is absurdly long. */
static bool numtext(parser *P, const tok *t, char *buf, size_t size)
{
	if (t->len >= size)
		return perr(P, t, "number too long");
	memcpy(buf, t->p, t->len);
	buf[t->len] = 0;
	return true;
}

static bool tok_int(parser *P, const tok *t, int64_t *v)
{
	char b[40];
	if (!numtext(P, t, b, sizeof b))
		return false;
	errno = 0;
	long long x = strtoll(b, NULL, 10);
	if (errno == ERANGE)
		return perr(P, t, "integer %s out of range", b);
	*v = x;
	return true;
}

/* real = INT | FLOAT | '-'? ('inf' | 'nan') */
static bool parse_real(parser *P, double *v)
{
	tok t = P->tk;
	bool neg = accept(P, "-");
	if (at_kw(P, "inf") || at_kw(P, "nan")) {
		*v = at_kw(P, "inf") ? INFINITY : NAN;
		if (neg)
			*v = -*v;
		next(P);
		return true;
	}
	if (neg || (P->tk.kind != T_INT && P->tk.kind != T_FLOAT))
		return neg ? expected(P, "'inf' or 'nan' after '-'") : expected(P, "a number");
	char b[400];
	if (!numtext(P, &P->tk, b, sizeof b))
		return false;
	errno = 0;
	*v = strtod(b, NULL);
	if (errno == ERANGE && isinf(*v))
		return perr(P, &t, "number %s out of range", b);
	next(P);
	return true;
}

/* ---- value names --------------------------------------------------------- */

/* "=name" or "#12": quoted and all-digit names never collide. */
static const char *ref_key(parser *P, const tok *t)
{
	const char *name = t->quoted ? unquote(P, t) : NULL;
	if (t->quoted && !name)
		return NULL;
	size_t len = name ? strlen(name) : t->len;
	char *k = ir_alloc(P->scratch, len + 2);
	if (!k)
		return perr(P, t, "out of memory"), NULL;
	bool digits = !t->quoted;
	for (size_t i = 0; i < t->len && digits; i++)
		digits = is_digit(t->p[i]);
	k[0] = digits ? '#' : '=';
	memcpy(k + 1, name ? name : t->p, len);
	return k;
}

static name_slot *slot(parser *P, const char *key)
{
	uint32_t h = ir_hash_str(key) & (P->capnames - 1);
	while (P->names[h].key && strcmp(P->names[h].key, key) != 0)
		h = (h + 1) & (P->capnames - 1);
	return &P->names[h];
}

static uint32_t lookup(parser *P, const char *key)
{
	return P->capnames ? slot(P, key)->id : 0;
}

static bool define(parser *P, const tok *t, const char *key, uint32_t id)
{
	if (2 * (P->nnames + 1) > P->capnames) {
		uint32_t oldcap = P->capnames, nc = oldcap ? oldcap * 2 : 64;
		name_slot *old = P->names;
		if (!(P->names = ir_alloc(P->scratch, nc * sizeof *P->names)))
			return perr(P, t, "out of memory");
		P->capnames = nc;
		for (uint32_t i = 0; i < oldcap; i++)
			if (old[i].key)
				*slot(P, old[i].key) = old[i];
	}
	*slot(P, key) = (name_slot){key, id};
	P->nnames++;
	return true;
}

/* The graph name of a value token: NULL for a bare number. */
static const char *ref_name(const char *key)
{
	return key[0] == '#' ? NULL : key + 1;
}

/* Resolves a use of a value; errors on an undefined one. */
static uint32_t use_ref(parser *P)
{
	char b[96];
	if (P->tk.kind != T_VALUE)
		return expected(P, "a value (%name)"), 0;
	const char *key = ref_key(P, &P->tk);
	uint32_t id = key ? lookup(P, key) : 0;
	if (key && !id)
		perr(P, &P->tk, "undefined value %s", show(&P->tk, b, sizeof b));
	next(P);
	return P->failed ? 0 : id;
}

/* A key for a value about to be defined; errors on a redefinition. */
static const char *def_ref(parser *P, const tok *t)
{
	char b[96];
	if (t->kind != T_VALUE)
		return expected(P, "a value (%name)"), NULL;
	const char *key = ref_key(P, t);
	if (key && lookup(P, key))
		return perr(P, t, "redefinition of %s", show(t, b, sizeof b)), NULL;
	return key;
}

/* ---- types and dimensions ------------------------------------------------ */

static int64_t parse_dim(parser *P);

/* Adds or multiplies two dims, refusing what would overflow int64 when ir.c
 * folds constants (including the constant parts of x+c and x*c). */
static int64_t dim_arith(parser *P, const tok *t, char op, int64_t a, int64_t b)
{
	int64_t ca = a, cb = b, r;
	if (a < 0 || b < 0) { /* fold partner: the constant inside x+c or x*c */
		const ir_dimexpr *e = ir_dim_expr(P->g, a < 0 ? a : b);
		int64_t c = a < 0 ? b : a;
		bool folds = e && e->op == (op == '+' ? IR_DADD : IR_DMUL) && e->b >= 0 && c >= 0;
		ca = folds ? e->b : 0;
		cb = folds ? c : 0;
	}
	bool ovf = op == '+' ? __builtin_add_overflow(ca, cb, &r) : __builtin_mul_overflow(ca, cb, &r);
	if (ovf)
		return perr(P, t, "dimension overflows"), 0;
	return op == '+' ? ir_dim_add(P->g, a, b) : ir_dim_mul(P->g, a, b);
}

/* dim_atom = INT | IDENT | '(' dim ')' */
static int64_t parse_dim_atom(parser *P)
{
	tok t = P->tk;
	int64_t v = 0;
	if (t.kind == T_INT) {
		if (tok_int(P, &t, &v) && v < 0)
			perr(P, &t, "dimension %lld is negative", (long long)v);
		next(P);
		return v;
	}
	if (t.kind == T_IDENT) {
		char name[128];
		if (t.len >= sizeof name)
			return perr(P, &t, "symbol name too long"), 0;
		memcpy(name, t.p, t.len);
		name[t.len] = 0;
		next(P);
		return ir_dim_sym(P->g, name);
	}
	if (!accept(P, "("))
		return expected(P, "a dimension (integer, symbol or '(')"), 0;
	if (++P->depth > KIR_MAX_DEPTH)
		return perr(P, &t, "dimension expression nested too deeply"), 0;
	v = parse_dim(P);
	P->depth--;
	expect(P, ")");
	return v;
}

/* dim_term = dim_atom (('*' | '/') dim_atom)* */
static int64_t parse_dim_term(parser *P)
{
	int64_t v = parse_dim_atom(P);
	while (!P->failed && (at(P, "*") || at(P, "/"))) {
		bool div = at(P, "/");
		next(P);
		tok t = P->tk;
		int64_t r = parse_dim_atom(P);
		if (P->failed)
			return 0;
		if (div && r <= 0)
			return perr(P, &t, "divisor must be a positive integer"), 0;
		v = div ? ir_dim_div(P->g, v, r) : dim_arith(P, &t, '*', v, r);
	}
	return v;
}

/* dim = dim_term ('+' dim_term)* */
static int64_t parse_dim(parser *P)
{
	int64_t v = parse_dim_term(P);
	while (!P->failed && accept(P, "+")) {
		tok t = P->tk;
		int64_t r = parse_dim_term(P);
		if (P->failed)
			return 0;
		v = dim_arith(P, &t, '+', v, r);
	}
	return v;
}

/* dtype = IDENT naming a kiln dtype */
static kiln_dtype parse_dtype(parser *P)
{
	char name[16] = {0}, b[96];
	if (P->tk.kind == T_IDENT && P->tk.len < sizeof name)
		memcpy(name, P->tk.p, P->tk.len);
	kiln_dtype dt = kiln_dtype_from_name(name);
	if (dt == KILN_DT_INVALID)
		return perr(P, &P->tk, "expected a dtype (f32, i64, ...), found %s",
		            show(&P->tk, b, sizeof b)), dt;
	next(P);
	return dt;
}

/* As the ONNX importer limits graph inputs: every fixed dim, and the
 * product of the non-zero fixed dims (symbols count as 1), at most 2^40,
 * kiln's cap for one tensor, so no size or stride computed from the type
 * later can overflow int64. */
static bool numel_ok(parser *P, const tok *start, const ir_type *t)
{
	uint64_t n = 1;
	char b[256];
	for (int i = 0; i < t->rank; i++) {
		uint64_t d = t->dim[i] > 0 ? (uint64_t)t->dim[i] : 1;
		if (d > IR_MAX_NUMEL / n)
			return perr(P, start, "type %s has more than 2^40 elements (kiln's limit for "
			            "one tensor)", ir_type_str(P->g, t, b, sizeof b));
		n *= d;
	}
	return true;
}

/* type = dtype '[' (dim (',' dim)*)? ']' */
static bool parse_type(parser *P, ir_type *t)
{
	tok start = P->tk;
	*t = (ir_type){.dtype = parse_dtype(P)};
	if (!expect(P, "["))
		return false;
	if (accept(P, "]"))
		return true;
	do {
		if (t->rank == KILN_MAX_RANK)
			return perr(P, &P->tk, "type has more than %d dimensions", KILN_MAX_RANK);
		t->dim[t->rank++] = parse_dim(P);
	} while (accept(P, ","));
	return expect(P, "]") && numel_ok(P, &start, t);
}

/* A type for data (params, dense tensors): no symbols. */
static bool parse_concrete_type(parser *P, ir_type *t)
{
	tok start = P->tk;
	if (!parse_type(P, t))
		return false;
	char b[256];
	if (!ir_type_concrete(t))
		return perr(P, &start, "type %s must have fixed dimensions",
		            ir_type_str(P->g, t, b, sizeof b));
	return true;
}

/* ---- dense tensors ------------------------------------------------------- */

static uint16_t float_to_half(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
	if (e == 0xff)
		return (uint16_t)(sign | 0x7c00 | (m ? 0x200 : 0));
	int32_t he = (int32_t)e - 127 + 15;
	if (he >= 31)
		return (uint16_t)(sign | 0x7c00);
	int shift = he <= 0 ? 14 - he : 13; /* subnormal halves lose more bits */
	if (shift > 24)
		return (uint16_t)sign;
	if (he <= 0)
		m |= 0x800000;
	uint32_t hm = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
	uint32_t h = sign | (he > 0 ? (uint32_t)he << 10 : 0) | hm;
	if (rem > half || (rem == half && (hm & 1)))
		h++; /* a carry into the exponent is still the right rounding */
	return (uint16_t)h;
}

static uint16_t float_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	if ((x & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((x >> 16) | 0x40);
	return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* Stores a float element, refusing finite values that would round to
 * infinity in the element type (a text must not change a value silently). */
static bool store_real(parser *P, const tok *t, kiln_tensor *x, int64_t i, double v)
{
	/* doubles from here up round to inf as f32; below it the cast is defined */
	const double f32_overflow = 0x1.ffffffp+127;
	bool finite = isfinite(v);
	if (x->dtype != KILN_F64 && finite && fabs(v) >= f32_overflow)
		return perr(P, t, "value out of range for %s", kiln_dtype_name(x->dtype));
	uint16_t h = 0;
	switch (x->dtype) {
	case KILN_F64: ((double *)x->data)[i] = v; return true;
	case KILN_F32: ((float *)x->data)[i] = (float)v; return true;
	case KILN_F16: h = float_to_half((float)v); break;
	default: h = float_to_bf16((float)v); break;
	}
	bool inf = x->dtype == KILN_F16 ? (h & 0x7fff) == 0x7c00 : (h & 0x7fff) == 0x7f80;
	if (finite && inf)
		return perr(P, t, "value out of range for %s", kiln_dtype_name(x->dtype));
	((uint16_t *)x->data)[i] = h;
	return true;
}

static bool store_int(parser *P, const tok *t, kiln_tensor *x, int64_t i, int64_t v)
{
	static const int64_t lo[KILN_DT_COUNT] = {[KILN_I8] = INT8_MIN, [KILN_I32] = INT32_MIN,
	                                          [KILN_I64] = INT64_MIN};
	static const int64_t hi[KILN_DT_COUNT] = {[KILN_I8] = INT8_MAX, [KILN_U8] = UINT8_MAX,
	                                          [KILN_I32] = INT32_MAX, [KILN_I64] = INT64_MAX,
	                                          [KILN_BOOL] = 1};
	if (v < lo[x->dtype] || v > hi[x->dtype])
		return perr(P, t, "value %lld out of range for %s", (long long)v,
		            kiln_dtype_name(x->dtype));
	switch (x->dtype) {
	case KILN_I64: ((int64_t *)x->data)[i] = v; break;
	case KILN_I32: ((int32_t *)x->data)[i] = (int32_t)v; break;
	case KILN_I8: ((int8_t *)x->data)[i] = (int8_t)v; break;
	default: ((uint8_t *)x->data)[i] = (uint8_t)v; break; /* u8, bool */
	}
	return true;
}

/* elems = '[' (elem (',' elem)*)? ']' with exactly numel(x) elements */
static bool parse_elems(parser *P, kiln_tensor *x, int64_t numel)
{
	char b[96];
	if (!expect(P, "["))
		return false;
	int64_t i = 0;
	for (; !P->failed && !at(P, "]"); i++) {
		tok t = P->tk;
		if (i == numel)
			return perr(P, &t, "dense<%s> has %lld elements, found more",
			            kiln_dtype_name(x->dtype), (long long)numel);
		if (i && !expect(P, ","))
			return false;
		t = P->tk;
		if (kiln_dtype_is_float(x->dtype)) {
			double v;
			if (parse_real(P, &v))
				store_real(P, &t, x, i, v);
		} else if (t.kind != T_INT) {
			return perr(P, &t, "expected an integer element of a %s tensor, found %s",
			            kiln_dtype_name(x->dtype), show(&t, b, sizeof b));
		} else {
			int64_t v = 0;
			if (tok_int(P, &t, &v) && store_int(P, &t, x, i, v))
				next(P);
		}
	}
	if (!P->failed && i < numel)
		return perr(P, &P->tk, "dense<%s> has %lld elements, found %lld",
		            kiln_dtype_name(x->dtype), (long long)numel, (long long)i);
	return expect(P, "]");
}

/* tensor = 'dense' '<' type '>' elems; the tensor is malloc'd */
static kiln_tensor *parse_tensor(parser *P)
{
	next(P); /* 'dense' */
	ir_type ty;
	if (!expect(P, "<") || !parse_concrete_type(P, &ty) || !expect(P, ">"))
		return NULL;
	/* every element is in the text, so a shape bigger than it is a lie that
	 * must not turn into a huge allocation */
	uint64_t numel = 1;
	for (int i = 0; i < ty.rank; i++)
		if (__builtin_mul_overflow(numel, (uint64_t)ty.dim[i], &numel))
			numel = UINT64_MAX;
	if (numel > (uint64_t)(P->end - P->cur))
		return perr(P, &P->tk, "dense tensor of %llu elements is longer than the text",
		            (unsigned long long)numel), NULL;
	kiln_tensor *x = kiln_tensor_new(ty.dtype, ty.rank, ty.dim);
	if (!x)
		return perr(P, &P->tk, "out of memory"), NULL;
	if (!parse_elems(P, x, (int64_t)numel)) {
		kiln_tensor_free(x);
		return NULL;
	}
	return x;
}

/* ---- attributes ---------------------------------------------------------- */

/* list = '[' (elem (',' elem)*)? ']', elem = real | dim: ints unless an
 * element is a float, or the list is empty and the op's schema says
 * floats; an element starting with a symbol or '(' is a symbolic dim. */
static bool parse_list(parser *P, ir_node *n, const char *name, ir_attr_kind want)
{
	uint32_t cnt = 0, cap = 8;
	double *f = ir_alloc(P->scratch, cap * sizeof *f);
	int64_t *iv = ir_alloc(P->scratch, cap * sizeof *iv);
	bool floats = false;
	uint64_t dims = 0;
	next(P); /* '[' */
	while (f && iv && !P->failed && !at(P, "]")) {
		if (cnt && !expect(P, ","))
			return false;
		tok t = P->tk;
		if (cnt == cap) {
			double *nf = ir_alloc(P->scratch, 2 * cap * sizeof *f);
			int64_t *ni = ir_alloc(P->scratch, 2 * cap * sizeof *iv);
			if (!nf || !ni)
				return perr(P, &t, "out of memory");
			memcpy(nf, f, cap * sizeof *f), memcpy(ni, iv, cap * sizeof *iv);
			f = nf, iv = ni, cap *= 2;
		}
		if (t.kind == T_INT) {
			if (tok_int(P, &t, &iv[cnt]))
				f[cnt] = (double)iv[cnt];
			next(P);
		} else if ((t.kind == T_IDENT && !at_kw(P, "inf") && !at_kw(P, "nan")) || at(P, "(")) {
			/* a symbolic dim (Slice's ends=[S]); the verifier checks the
			 * schema lets this attribute hold one */
			if (cnt >= 64)
				return perr(P, &t, "symbolic dims only in the first 64 elements");
			iv[cnt] = parse_dim(P);
			f[cnt] = 0;
			if (iv[cnt] < 0)
				dims |= (uint64_t)1 << cnt;
		} else {
			floats = true;
			parse_real(P, &f[cnt]);
		}
		cnt++;
	}
	if (!f || !iv)
		return perr(P, &P->tk, "out of memory");
	if (!expect(P, "]"))
		return false;
	if (floats && dims)
		return perr(P, &P->tk, "attribute '%s' mixes floats and symbolic dims", name);
	if (floats || (cnt == 0 && want == IR_A_FLOATS))
		return ir_attr_set_floats(P->g, n, name, cnt, f) == KILN_OK;
	return ir_attr_set_dims(P->g, n, name, cnt, iv, dims) == KILN_OK;
}

/* avalue = INT | real | STRING | dtype | list | tensor */
static bool parse_avalue(parser *P, ir_node *n, const char *name, ir_attr_kind want)
{
	tok t = P->tk;
	kiln_graph *g = P->g;
	char b[96];
	if (t.kind == T_INT) {
		int64_t v = 0;
		next(P);
		return tok_int(P, &t, &v) && ir_attr_set_int(g, n, name, v) == KILN_OK;
	}
	if (t.kind == T_FLOAT || at(P, "-") || at_kw(P, "inf") || at_kw(P, "nan")) {
		double v;
		return parse_real(P, &v) && ir_attr_set_float(g, n, name, v) == KILN_OK;
	}
	if (t.kind == T_STRING) {
		const char *s = unquote(P, &t);
		next(P);
		return s && ir_attr_set_string(g, n, name, s) == KILN_OK;
	}
	if (at(P, "["))
		return parse_list(P, n, name, want);
	if (at_kw(P, "dense")) {
		kiln_tensor *x = parse_tensor(P);
		kiln_status st = x ? ir_attr_set_tensor(g, n, name, x) : KILN_EPARSE;
		kiln_tensor_free(x);
		return st == KILN_OK;
	}
	if (t.kind == T_IDENT) {
		kiln_dtype dt = parse_dtype(P);
		return dt != KILN_DT_INVALID && ir_attr_set_dtype(g, n, name, dt) == KILN_OK;
	}
	return perr(P, &t, "bad value for attribute '%s': expected a number, string, dtype, "
	            "list or dense tensor, found %s", name, show(&t, b, sizeof b));
}

/* attrs = '{' (IDENT '=' avalue (',' IDENT '=' avalue)*)? '}' */
static bool parse_attrs(parser *P, ir_node *n)
{
	ir_attr_schema schema[32];
	int ns = ir_op_schema(n->op, schema, 32);
	next(P); /* '{' */
	while (!P->failed && !at(P, "}")) {
		if (n->nattr && !expect(P, ","))
			return false;
		tok t = P->tk;
		char name[48];
		if (t.kind != T_IDENT)
			return expected(P, "an attribute name");
		if (t.len >= sizeof name)
			return perr(P, &t, "attribute name too long");
		memcpy(name, t.p, t.len);
		name[t.len] = 0;
		if (ir_attr_get(n, name))
			return perr(P, &t, "duplicate attribute '%s'", name);
		ir_attr_kind want = IR_A_INTS;
		for (int i = 0; i < ns; i++)
			if (strcmp(schema[i].name, name) == 0)
				want = schema[i].kind;
		next(P);
		if (!expect(P, "=") || !parse_avalue(P, n, name, want))
			return P->failed ? false : perr(P, &t, "out of memory setting '%s'", name);
	}
	return expect(P, "}");
}

/* ---- statements ---------------------------------------------------------- */

/* decl = VALUE ':' type; defines the value (kind given) and returns its id */
static uint32_t parse_decl(parser *P, ir_value_kind kind, bool trainable)
{
	tok t = P->tk;
	const char *key = def_ref(P, &t);
	ir_type ty;
	next(P);
	if (!key || !expect(P, ":"))
		return 0;
	if (!(kind == IR_V_PARAM ? parse_concrete_type(P, &ty) : parse_type(P, &ty)))
		return 0;
	kiln_graph *g = P->g;
	uint32_t id;
	if (kind == IR_V_INPUT) {
		id = ir_input_new(g, ref_name(key), &ty);
	} else {
		uint64_t bytes = kiln_dtype_size(ty.dtype);
		for (int i = 0; i < ty.rank; i++)
			if (__builtin_mul_overflow(bytes, (uint64_t)ty.dim[i], &bytes))
				bytes = UINT64_MAX;
		if (__builtin_add_overflow(P->param_bytes, bytes, &P->param_bytes) ||
		    P->param_bytes > KIR_MAX_PARAM_BYTES)
			return perr(P, &t, "parameters exceed %llu bytes",
			            (unsigned long long)KIR_MAX_PARAM_BYTES), 0;
		id = ir_value_new(g, IR_V_PARAM, &ty, ref_name(key));
		if (id) {
			g->val[id]->trainable = trainable;
			g->val[id]->data = ir_tensor_new(g, ty.dtype, ty.rank, ty.dim);
			if (!g->val[id]->data)
				id = 0;
		}
	}
	if (!id)
		return perr(P, &t, "out of memory"), 0;
	return define(P, &t, key, id) ? id : 0;
}

/* results = '(' (result (',' result)*)? ')' | type
 * result  = VALUE ':' type | type */
static bool parse_results(parser *P)
{
	bool paren = accept(P, "(");
	uint32_t cap = 0;
	while (!P->failed && !(paren && at(P, ")"))) {
		if (paren && P->nresults && !expect(P, ","))
			return false;
		if (P->nresults == cap) {
			cap = cap ? 2 * cap : 8;
			result *r = ir_alloc(P->scratch, cap * sizeof *r);
			if (!r)
				return perr(P, &P->tk, "out of memory");
			if (P->nresults)
				memcpy(r, P->results, P->nresults * sizeof *r);
			P->results = r;
		}
		result *r = &P->results[P->nresults++];
		r->ref.kind = T_EOF;
		if (P->tk.kind == T_VALUE) {
			r->ref = P->tk;
			next(P);
			expect(P, ":");
		}
		parse_type(P, &r->type);
		if (!paren)
			break;
	}
	return !paren || expect(P, ")");
}

/* Checks ret's i-th value against the signature's i-th result. */
static bool check_result(parser *P, const tok *t, uint32_t i, uint32_t id)
{
	char b1[96], b2[96], t1[256], t2[256];
	if (i >= P->nresults)
		return perr(P, t, "ret has more values than the %u result%s in the signature",
		            P->nresults, P->nresults == 1 ? "" : "s");
	const result *r = &P->results[i];
	if (r->ref.kind == T_VALUE) {
		const char *k1 = ref_key(P, t), *k2 = ref_key(P, &r->ref);
		if (k1 && k2 && strcmp(k1, k2) != 0)
			return perr(P, t, "ret value %u is %s but the signature names %s", i,
			            show(t, b1, sizeof b1), show(&r->ref, b2, sizeof b2));
	}
	const ir_type *vt = &P->g->val[id]->type;
	if (!P->failed && !ir_type_eq(vt, &r->type))
		return perr(P, t, "ret value %s is %s but the signature says %s",
		            show(t, b1, sizeof b1), ir_type_str(P->g, vt, t1, sizeof t1),
		            ir_type_str(P->g, &r->type, t2, sizeof t2));
	return !P->failed;
}

/* ret = 'ret' (VALUE (',' VALUE)*)? */
static bool parse_ret(parser *P)
{
	tok kw = P->tk;
	uint32_t i = 0;
	next(P);
	while (!P->failed && P->tk.kind == T_VALUE) {
		tok t = P->tk;
		uint32_t id = use_ref(P);
		if (!id || !check_result(P, &t, i++, id))
			return false;
		if (ir_output_add(P->g, id, NULL) != KILN_OK)
			return perr(P, &t, "out of memory");
		if (!accept(P, ","))
			break;
		if (P->tk.kind != T_VALUE)
			return expected(P, "a value after ','");
	}
	if (!P->failed && i < P->nresults)
		return perr(P, &kw, "ret gives %u value%s but the signature declares %u", i,
		            i == 1 ? "" : "s", P->nresults);
	return !P->failed;
}

/* ---- nodes --------------------------------------------------------------- */

typedef struct vlist {
	tok *t;
	const char **key;
	uint32_t *id;
	uint32_t n, cap;
} vlist;

static bool vlist_push(parser *P, vlist *l, const tok *t, const char *key, uint32_t id)
{
	if (l->n == l->cap) {
		uint32_t nc = l->cap ? 2 * l->cap : 8;
		tok *nt = ir_alloc(P->scratch, nc * sizeof *nt);
		const char **nk = ir_alloc(P->scratch, nc * sizeof *nk);
		uint32_t *ni = ir_alloc(P->scratch, nc * sizeof *ni);
		if (!nt || !nk || !ni)
			return perr(P, t, "out of memory");
		if (l->n) {
			memcpy(nt, l->t, l->n * sizeof *nt);
			memcpy(nk, l->key, l->n * sizeof *nk);
			memcpy(ni, l->id, l->n * sizeof *ni);
		}
		l->t = nt, l->key = nk, l->id = ni, l->cap = nc;
	}
	l->t[l->n] = *t;
	l->key[l->n] = key;
	l->id[l->n++] = id;
	return true;
}

/* outs = VALUE (',' VALUE)*, none defined before or twice here */
static bool parse_outs(parser *P, vlist *outs)
{
	char b[96];
	do {
		tok t = P->tk;
		const char *key = def_ref(P, &t);
		if (!key)
			return false;
		for (uint32_t i = 0; i < outs->n; i++)
			if (strcmp(outs->key[i], key) == 0)
				return perr(P, &t, "redefinition of %s", show(&t, b, sizeof b));
		if (!vlist_push(P, outs, &t, key, 0))
			return false;
		next(P);
	} while (accept(P, ","));
	return expect(P, "=");
}

/* operands = (VALUE (',' VALUE)*)? */
static bool parse_operands(parser *P, vlist *ins)
{
	while (!P->failed && P->tk.kind == T_VALUE) {
		tok t = P->tk;
		uint32_t id = use_ref(P);
		if (!id || !vlist_push(P, ins, &t, NULL, id) || !accept(P, ","))
			break;
		if (P->tk.kind != T_VALUE)
			return expected(P, "a value after ','");
	}
	return !P->failed;
}

/* "takes 2 operands", "takes 2 to 3 operands", "takes at least 1 operand" */
static const char *count_str(char *buf, size_t size, unsigned lo, unsigned hi, const char *what)
{
	if (hi == IR_VARIADIC)
		snprintf(buf, size, "at least %u %s%s", lo, what, lo == 1 ? "" : "s");
	else if (lo == hi)
		snprintf(buf, size, "%u %s%s", lo, what, lo == 1 ? "" : "s");
	else
		snprintf(buf, size, "%u to %u %ss", lo, hi, what);
	return buf;
}

/* Operand and result counts against the op table: structural, so an error
 * here points at the op rather than waiting for the verifier. */
static bool check_arity(parser *P, const tok *t, kiln_op op, uint32_t nin, uint32_t nout)
{
	const ir_op_info *o = ir_op(op);
	char b[64];
	if (nin < o->in_min || (o->in_max != IR_VARIADIC && nin > o->in_max))
		return perr(P, t, "%s takes %s, found %u", o->kir,
		            count_str(b, sizeof b, o->in_min, o->in_max, "operand"), nin);
	if (nout < o->out_min || (o->out_max != IR_VARIADIC && nout > o->out_max))
		return perr(P, t, "%s has %s, found %u", o->kir,
		            count_str(b, sizeof b, o->out_min, o->out_max, "result"), nout);
	return true;
}

/* types = type (',' type)*, one per result */
static bool parse_out_types(parser *P, ir_node *n)
{
	if (!expect(P, ":"))
		return false;
	for (uint32_t i = 0; i < n->nout; i++) {
		ir_type ty;
		if (i && !accept(P, ","))
			return perr(P, &P->tk, "node has %u results but %u type%s", n->nout, i,
			            i == 1 ? "" : "s");
		if (!parse_type(P, &ty))
			return false;
		P->g->val[n->out[i]]->type = ty;
	}
	if (at(P, ","))
		return perr(P, &P->tk, "node has %u result%s but more types", n->nout,
		            n->nout == 1 ? "" : "s");
	return true;
}

/* suffix = ('name' '(' STRING ')')? ('loc' '(' STRING ':' INT ')')? */
static bool parse_suffix(parser *P, ir_node *n)
{
	if (at_kw(P, "name")) {
		next(P);
		tok t = P->tk;
		if (!expect(P, "("))
			return false;
		t = P->tk;
		if (t.kind != T_STRING)
			return expected(P, "a string for the node name");
		const char *s = unquote(P, &t);
		if (!s || !(n->name = ir_intern(P->g, s)))
			return perr(P, &t, "out of memory");
		next(P);
		if (!expect(P, ")"))
			return false;
	}
	if (!at_kw(P, "loc"))
		return true;
	next(P);
	if (!expect(P, "("))
		return false;
	tok t = P->tk;
	if (t.kind != T_STRING)
		return expected(P, "a file name string in loc(...)");
	const char *file = unquote(P, &t);
	next(P);
	int64_t line = 0;
	if (!file || !expect(P, ":"))
		return false;
	tok lt = P->tk;
	if (lt.kind != T_INT)
		return expected(P, "a line number in loc(...)");
	if (!tok_int(P, &lt, &line) || line < 0 || line > INT32_MAX)
		return perr(P, &lt, "bad line number in loc(...)");
	next(P);
	n->loc = (kiln_loc){ir_intern(P->g, file), (int)line};
	return n->loc.file ? expect(P, ")") : perr(P, &t, "out of memory");
}

/* node = outs '=' IDENT operands attrs? ':' types suffix */
static bool parse_node(parser *P)
{
	char b[96], opname[48] = {0};
	vlist outs = {0}, ins = {0};
	tok first = P->tk;
	if (!parse_outs(P, &outs))
		return false;
	tok optok = P->tk;
	if (optok.kind == T_IDENT && optok.len < sizeof opname)
		memcpy(opname, optok.p, optok.len);
	kiln_op op = ir_op_from_kir(opname);
	if (optok.kind != T_IDENT)
		return expected(P, "an op name");
	if (op == KILN_OP_COUNT)
		return perr(P, &optok, "unknown op %s", show(&optok, b, sizeof b));
	next(P);
	if (!parse_operands(P, &ins) || !check_arity(P, &optok, op, ins.n, outs.n))
		return false;
	ir_node *n = ir_node_new(P->g, op, ins.n, ins.id, outs.n,
	                         (kiln_loc){P->file, first.line});
	if (!n)
		return perr(P, &optok, "%s", P->g->errmsg);
	if (at(P, "{") && !parse_attrs(P, n))
		return false;
	if (!parse_out_types(P, n) || !parse_suffix(P, n))
		return false;
	for (uint32_t i = 0; i < outs.n; i++) {
		const char *name = ref_name(outs.key[i]);
		ir_value *v = P->g->val[n->out[i]];
		if (name && !(v->name = ir_intern(P->g, name)))
			return perr(P, &outs.t[i], "out of memory");
		if (!define(P, &outs.t[i], outs.key[i], n->out[i]))
			return false;
	}
	return true;
}

/* ---- the graph ----------------------------------------------------------- */

/* body = (('param' | 'buffer') decl | node)* 'ret' ... '}' */
static bool parse_body(parser *P)
{
	while (!P->failed) {
		if (at_kw(P, "param") || at_kw(P, "buffer")) {
			bool trainable = at_kw(P, "param");
			next(P);
			parse_decl(P, IR_V_PARAM, trainable);
		} else if (at_kw(P, "ret")) {
			return parse_ret(P) && expect(P, "}");
		} else if (P->tk.kind == T_VALUE) {
			parse_node(P);
		} else if (at(P, "}")) {
			return perr(P, &P->tk, "expected 'ret' before '}'");
		} else {
			return expected(P, "a statement (param, buffer, a node or ret)");
		}
	}
	return false;
}

/* graph = 'graph' GLOBAL '(' (decl (',' decl)*)? ')' '->' results '{' body EOF */
static bool parse_graph(parser *P)
{
	if (!at_kw(P, "graph"))
		return expected(P, "'graph'");
	next(P);
	if (P->tk.kind != T_GLOBAL)
		return expected(P, "a graph name (@name)");
	tok t = P->tk;
	const char *name = t.quoted ? unquote(P, &t) : NULL;
	char *bare = t.quoted ? NULL : ir_alloc(P->scratch, t.len + 1);
	if (bare)
		memcpy(bare, t.p, t.len);
	if (!(P->g = kiln_graph_new(name ? name : bare)) ||
	    !(P->file = ir_intern(P->g, P->file)))
		return perr(P, &t, "out of memory");
	next(P);
	if (!expect(P, "("))
		return false;
	while (!P->failed && !at(P, ")")) {
		if (P->g->ninput && !expect(P, ","))
			return false;
		parse_decl(P, IR_V_INPUT, false);
	}
	if (!expect(P, ")") || !expect(P, "->") || !parse_results(P) || !expect(P, "{") ||
	    !parse_body(P))
		return false;
	if (P->tk.kind != T_EOF)
		return expected(P, "end of input after '}'");
	return true;
}

kiln_status ir_parse(const char *text, const char *filename, kiln_graph **out,
                     kiln_error *err)
{
	if (out)
		*out = NULL;
	if (!text || !out)
		return ir_seterr(err, KILN_EINVAL, "ir_parse: null argument");
	parser P = {.cur = text, .end = text + strlen(text), .linestart = text, .line = 1,
	            .file = filename && *filename ? filename : "<kir>"};
	if (!(P.scratch = ir_arena_new()))
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	next(&P);
	if (parse_graph(&P) && P.g->status != KILN_OK)
		perr(&P, &P.tk, "%s", P.g->errmsg);
	ir_arena_free(P.scratch);
	if (P.failed) {
		kiln_graph_free(P.g);
		if (err)
			*err = P.err;
		return P.err.code;
	}
	*out = P.g;
	return KILN_OK;
}
