/*
 * safetensors.c: reading and writing .safetensors files, the format of
 * Hugging Face's `safetensors` library and so of most PyTorch checkpoints.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON, then
 * the data buffer:
 *   {"__metadata__":{"k":"v"}, "w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}
 * with offsets relative to the buffer.  The reader carries its own JSON
 * parser for exactly this subset (objects, strings with every JSON escape,
 * arrays of unsigned integers); anything else is refused with a message
 * naming the file and the byte.  Each tensor is then checked: a known
 * dtype, rank <= KILN_MAX_RANK, offsets inside the buffer, a size that
 * matches shape times dtype, no duplicate names and no two tensors sharing
 * bytes.  The last check also bounds memory: tensors that cannot overlap fit
 * in the file, so a hostile header cannot make us allocate more than the
 * file holds.  Gaps between tensors and bytes after the last are tolerated.
 *
 * The writer reproduces the Rust library's serializer byte for byte:
 * tensors ordered by descending dtype (as the library's Dtype enum orders
 * them, which is by alignment) and then by name, packed with no gaps (the
 * library's reader rejects gaps), compact JSON with the keys in the order
 * dtype, shape, data_offsets, and the header padded with spaces to a
 * multiple of 8.  Packing by descending alignment leaves every tensor
 * aligned to its element size.  No __metadata__ is written.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

#define MAX_HEADER 100000000u /* the Rust library's limit */
#define NAME_FMT "%.200s"    /* names in messages, bounded */

/* order: position in the Rust library's Dtype enum, which sets write order. */
static const struct {
	const char *name;
	int order;
} st_dtypes[KILN_DT_COUNT] = {
	[KILN_BOOL] = {"BOOL", 0}, [KILN_U8] = {"U8", 1},    [KILN_I8] = {"I8", 2},
	[KILN_F16] = {"F16", 7},   [KILN_BF16] = {"BF16", 8}, [KILN_I32] = {"I32", 9},
	[KILN_F32] = {"F32", 11},  [KILN_F64] = {"F64", 12},  [KILN_I64] = {"I64", 13},
};
/* Valid in the format, but kiln has no such dtype. */
static const char *const foreign[] = {"I16", "U16", "U32", "U64", "F8_E5M2", "F8_E4M3"};

/* One tensor as described by the header. */
typedef struct entry {
	char *name;
	kiln_dtype dt;
	int rank;
	int64_t shape[KILN_MAX_RANK];
	uint64_t begin, end;
} entry;

typedef struct parser {
	const char *s, *p, *end; /* header text and cursor */
	const char *path;
	kiln_error *err;
	entry *ents;
	size_t n, cap;
	bool have_meta;
} parser;

/* ---- JSON lexing ------------------------------------------------------- */

static kiln_status bad(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static kiln_status bad(parser *ps, const char *fmt, ...)
{
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	return rt_seterr(ps->err, KILN_EPARSE, "%s: safetensors header, byte %td: %s",
	                 ps->path, ps->p - ps->s, what);
}

static void ws(parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' ||
	                           *ps->p == '\r'))
		ps->p++;
}

/* Is the next token c? */
static bool at(parser *ps, char c)
{
	ws(ps);
	return ps->p < ps->end && *ps->p == c;
}

static bool eat(parser *ps, char c)
{
	if (!at(ps, c))
		return false;
	ps->p++;
	return true;
}

static kiln_status expect(parser *ps, char c)
{
	if (eat(ps, c))
		return KILN_OK;
	if (ps->p >= ps->end)
		return bad(ps, "expected '%c', found the end of the header", c);
	return bad(ps, "expected '%c'", c);
}

/* The length of the valid UTF-8 sequence at p, or 0 (overlong, surrogate,
 * beyond U+10FFFF, or cut off). */
static int utf8_len(const unsigned char *p, const unsigned char *end)
{
	int n = p[0] < 0x80 ? 1 : p[0] >= 0xc2 && p[0] < 0xe0 ? 2 : p[0] >= 0xe0 && p[0] < 0xf0 ? 3
	      : p[0] >= 0xf0 && p[0] < 0xf5 ? 4 : 0;
	if (n == 0 || end - p < n)
		return 0;
	for (int i = 1; i < n; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
	    (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
		return 0;
	return n;
}

static int hex4(const char *p)
{
	int v = 0;
	for (int i = 0; i < 4; i++) {
		char c = p[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
		      : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0)
			return -1;
		v = v * 16 + d;
	}
	return v;
}

/* Decodes \uXXXX (and its low surrogate, for a pair) at ps->p into out. */
static kiln_status uescape(parser *ps, char *out, size_t *n)
{
	int c = ps->end - ps->p >= 6 ? hex4(ps->p + 2) : -1;
	if (c < 0)
		return bad(ps, "bad \\u escape");
	ps->p += 6;
	if (c >= 0xdc00 && c < 0xe000)
		return bad(ps, "lone low surrogate in \\u escape");
	if (c >= 0xd800 && c < 0xdc00) {
		int lo = ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u'
			? hex4(ps->p + 2) : -1;
		if (lo < 0xdc00 || lo >= 0xe000)
			return bad(ps, "high surrogate not followed by a low one");
		ps->p += 6;
		c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
	}
	if (c == 0)
		return bad(ps, "NUL character in string");
	unsigned char *o = (unsigned char *)out + *n;
	if (c < 0x80) {
		o[0] = (unsigned char)c, *n += 1;
	} else if (c < 0x800) {
		o[0] = 0xc0 | c >> 6, o[1] = 0x80 | (c & 0x3f), *n += 2;
	} else if (c < 0x10000) {
		o[0] = 0xe0 | c >> 12, o[1] = 0x80 | (c >> 6 & 0x3f), o[2] = 0x80 | (c & 0x3f);
		*n += 3;
	} else {
		o[0] = 0xf0 | c >> 18, o[1] = 0x80 | (c >> 12 & 0x3f);
		o[2] = 0x80 | (c >> 6 & 0x3f), o[3] = 0x80 | (c & 0x3f), *n += 4;
	}
	return KILN_OK;
}

/* Decodes the escape at ps->p (a backslash) into out. */
static kiln_status escape(parser *ps, char *out, size_t *n)
{
	static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
	if (ps->end - ps->p < 2)
		return bad(ps, "unterminated string");
	if (ps->p[1] == 'u')
		return uescape(ps, out, n);
	const char *f = ps->p[1] ? strchr(from, ps->p[1]) : NULL;
	if (!f)
		return bad(ps, "bad escape '\\%c'", ps->p[1] >= 0x20 ? ps->p[1] : '?');
	out[(*n)++] = to[f - from];
	ps->p += 2;
	return KILN_OK;
}

/* string := '"' (utf8-char | escape)* '"'   -> a malloc'd C string */
static kiln_status string(parser *ps, char **out)
{
	*out = NULL;
	if (!eat(ps, '"'))
		return bad(ps, "expected a string");
	/* Escapes only shrink, so the raw span bounds the decoded length. */
	const char *q = ps->p;
	while (q < ps->end && *q != '"')
		q += *q == '\\' ? 2 : 1;
	if (q >= ps->end)
		return bad(ps, "unterminated string");
	char *s = malloc((size_t)(q - ps->p) + 1);
	if (!s)
		return rt_seterr(ps->err, KILN_ENOMEM, "%s: out of memory", ps->path);
	size_t n = 0;
	kiln_status st = KILN_OK;
	while (st == KILN_OK && *ps->p != '"') {
		const unsigned char *u = (const unsigned char *)ps->p;
		int len;
		if (*u == '\\') {
			st = escape(ps, s, &n);
		} else if (*u < 0x20) {
			st = bad(ps, "control character in string");
		} else if ((len = utf8_len(u, (const unsigned char *)ps->end)) == 0) {
			st = bad(ps, "invalid UTF-8 in string");
		} else {
			memcpy(s + n, u, (size_t)len);
			n += (size_t)len;
			ps->p += len;
		}
	}
	if (st != KILN_OK) {
		free(s);
		return st;
	}
	ps->p++;
	s[n] = '\0';
	*out = s;
	return KILN_OK;
}

/* number := '0' | [1-9][0-9]*   (JSON: no sign, fraction, exponent or leading 0) */
static kiln_status number(parser *ps, uint64_t *out)
{
	ws(ps);
	const char *p = ps->p;
	if (p >= ps->end || *p < '0' || *p > '9')
		return bad(ps, "expected a non-negative integer");
	uint64_t v = 0;
	for (; p < ps->end && *p >= '0' && *p <= '9'; p++) {
		if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
			return bad(ps, "integer too large");
		v = v * 10 + (uint64_t)(*p - '0');
	}
	if (p < ps->end && (*p == '.' || *p == 'e' || *p == 'E'))
		return bad(ps, "expected an integer, not a fraction");
	if (*ps->p == '0' && p - ps->p > 1)
		return bad(ps, "leading zero in integer");
	ps->p = p;
	*out = v;
	return KILN_OK;
}

/* numbers := '[' [number (',' number)*] ']'
 * Stores the first max and counts them all, so callers can say how many. */
static kiln_status numbers(parser *ps, uint64_t *v, int max, int *n)
{
	kiln_status st = expect(ps, '[');
	*n = 0;
	if (st != KILN_OK || eat(ps, ']'))
		return st;
	do {
		uint64_t x = 0;
		if ((st = number(ps, &x)) != KILN_OK)
			return st;
		if (*n < max)
			v[*n] = x;
		(*n)++;
	} while (eat(ps, ',') && *n < INT32_MAX);
	return expect(ps, ']');
}

/* ---- the header -------------------------------------------------------- */

static kiln_status dtype(parser *ps, entry *e)
{
	char *name;
	kiln_status st = string(ps, &name);
	if (st != KILN_OK)
		return st;
	for (int dt = 1; dt < KILN_DT_COUNT && !e->dt; dt++)
		if (strcmp(name, st_dtypes[dt].name) == 0)
			e->dt = (kiln_dtype)dt;
	for (size_t i = 0; !e->dt && i < sizeof foreign / sizeof foreign[0]; i++)
		if (strcmp(name, foreign[i]) == 0)
			st = rt_seterr(ps->err, KILN_EUNSUPPORTED, "%s: tensor '" NAME_FMT "': dtype "
			               "%s is not supported by kiln", ps->path, e->name, name);
	if (!e->dt && st == KILN_OK)
		st = rt_seterr(ps->err, KILN_EPARSE, "%s: tensor '" NAME_FMT "': unknown dtype '"
		               NAME_FMT "'", ps->path, e->name, name);
	free(name);
	return st;
}

static kiln_status shape(parser *ps, entry *e)
{
	uint64_t v[KILN_MAX_RANK];
	kiln_status st = numbers(ps, v, KILN_MAX_RANK, &e->rank);
	if (st != KILN_OK)
		return st;
	if (e->rank > KILN_MAX_RANK)
		return rt_seterr(ps->err, KILN_EUNSUPPORTED, "%s: tensor '" NAME_FMT "': rank %d "
		                 "exceeds KILN_MAX_RANK (%d)", ps->path, e->name, e->rank,
		                 KILN_MAX_RANK);
	for (int i = 0; i < e->rank; i++) {
		if (v[i] > INT64_MAX)
			return bad(ps, "tensor '" NAME_FMT "': dimension too large", e->name);
		e->shape[i] = (int64_t)v[i];
	}
	return KILN_OK;
}

static kiln_status offsets(parser *ps, entry *e)
{
	uint64_t v[2];
	int n;
	kiln_status st = numbers(ps, v, 2, &n);
	if (st != KILN_OK)
		return st;
	if (n != 2)
		return bad(ps, "tensor '" NAME_FMT "': data_offsets needs 2 numbers, not %d",
		           e->name, n);
	e->begin = v[0], e->end = v[1];
	return KILN_OK;
}

/* field := '"dtype"' ':' string | '"shape"' ':' numbers | '"data_offsets"' ':' numbers
 * seen collects one bit per field, to catch duplicates and omissions. */
static kiln_status field(parser *ps, entry *e, unsigned *seen)
{
	static const char *const names[] = {"dtype", "shape", "data_offsets"};
	char *key;
	kiln_status st = string(ps, &key);
	if (st != KILN_OK)
		return st;
	int k = 0;
	while (k < 3 && strcmp(key, names[k]) != 0)
		k++;
	if (k == 3 || (*seen & (1u << k)))
		st = bad(ps, "tensor '" NAME_FMT "': %s key '" NAME_FMT "'", e->name,
		         k == 3 ? "unknown" : "duplicate", key);
	free(key);
	if (st == KILN_OK)
		st = expect(ps, ':');
	if (st != KILN_OK)
		return st;
	*seen |= 1u << k;
	return k == 0 ? dtype(ps, e) : k == 1 ? shape(ps, e) : offsets(ps, e);
}

/* Checks one tensor's description against itself and the buffer size. */
static kiln_status check_entry(parser *ps, const entry *e, uint64_t bufsize)
{
	size_t nbytes;
	const char *path = ps->path;
	if (e->begin > e->end)
		return rt_seterr(ps->err, KILN_EPARSE, "%s: tensor '" NAME_FMT "': data_offsets "
		                 "[%llu, %llu] are reversed", path, e->name,
		                 (unsigned long long)e->begin, (unsigned long long)e->end);
	if (e->end > bufsize)
		return rt_seterr(ps->err, KILN_EPARSE, "%s: tensor '" NAME_FMT "': data_offsets "
		                 "[%llu, %llu] run past the data buffer (%llu bytes)", path,
		                 e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
		                 (unsigned long long)bufsize);
	if (!rt_shape_bytes(e->dt, e->rank, e->shape, &nbytes))
		return rt_seterr(ps->err, KILN_EPARSE, "%s: tensor '" NAME_FMT "': shape is too "
		                 "large", path, e->name);
	if (nbytes != e->end - e->begin)
		return rt_seterr(ps->err, KILN_EPARSE, "%s: tensor '" NAME_FMT "': data_offsets "
		                 "[%llu, %llu] hold %llu bytes but its %s shape needs %zu", path,
		                 e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
		                 (unsigned long long)(e->end - e->begin), st_dtypes[e->dt].name,
		                 nbytes);
	return KILN_OK;
}

/* info := '{' field (',' field)* '}'   with all three fields */
static kiln_status info(parser *ps, entry *e, uint64_t bufsize)
{
	unsigned seen = 0;
	kiln_status st = expect(ps, '{');
	if (st == KILN_OK && eat(ps, '}'))
		st = bad(ps, "tensor '" NAME_FMT "': empty description", e->name);
	while (st == KILN_OK) {
		if ((st = field(ps, e, &seen)) != KILN_OK || !eat(ps, ','))
			break;
	}
	if (st == KILN_OK)
		st = expect(ps, '}');
	if (st == KILN_OK && seen != 7)
		st = bad(ps, "tensor '" NAME_FMT "': missing %s", e->name,
		         !(seen & 1) ? "dtype" : !(seen & 2) ? "shape" : "data_offsets");
	return st == KILN_OK ? check_entry(ps, e, bufsize) : st;
}

/* metadata := '{' [string ':' string (',' string ':' string)*] '}'
 * Read for validity, then dropped: kiln_tensor_set has no place for it. */
static kiln_status metadata(parser *ps)
{
	if (ps->have_meta)
		return bad(ps, "duplicate __metadata__");
	ps->have_meta = true;
	kiln_status st = expect(ps, '{');
	if (st != KILN_OK || eat(ps, '}'))
		return st;
	do {
		char *k = NULL, *v = NULL;
		st = string(ps, &k);
		if (st == KILN_OK)
			st = expect(ps, ':');
		if (st == KILN_OK && !at(ps, '"'))
			st = bad(ps, "__metadata__ values must be strings");
		if (st == KILN_OK)
			st = string(ps, &v);
		free(k);
		free(v);
	} while (st == KILN_OK && eat(ps, ','));
	return st == KILN_OK ? expect(ps, '}') : st;
}

/* member := string ':' (metadata | info) */
static kiln_status member(parser *ps, uint64_t bufsize)
{
	char *name;
	kiln_status st = string(ps, &name);
	if (st == KILN_OK)
		st = expect(ps, ':');
	if (st == KILN_OK && strcmp(name, "__metadata__") == 0) {
		free(name);
		return metadata(ps);
	}
	if (st == KILN_OK && ps->n == ps->cap) {
		size_t cap = ps->cap ? 2 * ps->cap : 16;
		entry *ents = realloc(ps->ents, cap * sizeof *ents);
		if (!ents)
			st = rt_seterr(ps->err, KILN_ENOMEM, "%s: out of memory", ps->path);
		else
			ps->ents = ents, ps->cap = cap;
	}
	if (st != KILN_OK) {
		free(name);
		return st;
	}
	entry *e = &ps->ents[ps->n++];
	*e = (entry){.name = name};
	return info(ps, e, bufsize);
}

/* header := '{' [member (',' member)*] '}' ws* */
static kiln_status parse(parser *ps, uint64_t bufsize)
{
	kiln_status st = expect(ps, '{');
	if (st == KILN_OK && !eat(ps, '}')) {
		do
			st = member(ps, bufsize);
		while (st == KILN_OK && eat(ps, ','));
		if (st == KILN_OK)
			st = expect(ps, '}');
	}
	ws(ps);
	if (st == KILN_OK && ps->p != ps->end)
		st = bad(ps, "junk after the header's closing brace");
	return st;
}

/* ---- reading ----------------------------------------------------------- */

static int by_name(const void *a, const void *b)
{
	return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

static int by_offset(const void *a, const void *b)
{
	const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Rejects duplicate names and tensors that share bytes. */
static kiln_status check_set(parser *ps)
{
	kiln_status st = KILN_OK;
	if (ps->n < 2)
		return st;
	entry **v = malloc(ps->n * sizeof *v);
	if (!v)
		return rt_seterr(ps->err, KILN_ENOMEM, "%s: out of memory", ps->path);
	for (size_t i = 0; i < ps->n; i++)
		v[i] = &ps->ents[i];
	qsort(v, ps->n, sizeof *v, by_name);
	for (size_t i = 1; i < ps->n && st == KILN_OK; i++)
		if (strcmp(v[i - 1]->name, v[i]->name) == 0)
			st = rt_seterr(ps->err, KILN_EPARSE, "%s: duplicate tensor name '" NAME_FMT
			               "'", ps->path, v[i]->name);
	qsort(v, ps->n, sizeof *v, by_offset);
	const entry *last = NULL; /* the non-empty tensor reaching furthest so far */
	for (size_t i = 0; i < ps->n && st == KILN_OK; i++) {
		if (v[i]->begin == v[i]->end)
			continue; /* empty tensors share no bytes */
		if (last && v[i]->begin < last->end)
			st = rt_seterr(ps->err, KILN_EPARSE, "%s: tensors '" NAME_FMT "' and '"
			               NAME_FMT "' overlap in the data buffer", ps->path,
			               last->name, v[i]->name);
		if (!last || v[i]->end > last->end)
			last = v[i];
	}
	free(v);
	return st;
}

/* Reads the 8-byte length and the header text; *bufsize is what follows. */
static kiln_status read_header(int fd, uint64_t fsize, parser *ps, char **text,
                               uint64_t *bufsize)
{
	unsigned char len8[8];
	if (fsize < 8)
		return rt_seterr(ps->err, KILN_EPARSE, "%s: too short for a safetensors file "
		                 "(%llu bytes)", ps->path, (unsigned long long)fsize);
	kiln_status st = rt_pread(fd, len8, 8, 0, ps->path, ps->err);
	if (st != KILN_OK)
		return st;
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	if (n > MAX_HEADER)
		return rt_seterr(ps->err, KILN_EPARSE, "%s: safetensors header length %llu "
		                 "exceeds the %u-byte limit", ps->path, (unsigned long long)n,
		                 MAX_HEADER);
	if (n > fsize - 8)
		return rt_seterr(ps->err, KILN_EPARSE, "%s: safetensors header length %llu runs "
		                 "past the end of the file (%llu bytes)", ps->path,
		                 (unsigned long long)n, (unsigned long long)fsize);
	if (!(*text = malloc(n + 1)))
		return rt_seterr(ps->err, KILN_ENOMEM, "%s: out of memory", ps->path);
	if ((st = rt_pread(fd, *text, n, 8, ps->path, ps->err)) != KILN_OK)
		return st;
	(*text)[n] = '\0';
	ps->s = ps->p = *text;
	ps->end = *text + n;
	*bufsize = fsize - 8 - n;
	return KILN_OK;
}

/* Moves the parsed entries into a new set, reading each tensor's bytes. */
static kiln_status load(parser *ps, int fd, uint64_t data_off, kiln_tensor_set **out)
{
	kiln_tensor_set *s = kiln_tensor_set_new();
	if (s && ps->n)
		s->items = calloc(ps->n, sizeof *s->items);
	if (!s || (ps->n && !s->items)) {
		kiln_tensor_set_free(s);
		return rt_seterr(ps->err, KILN_ENOMEM, "%s: out of memory", ps->path);
	}
	kiln_status st = KILN_OK;
	for (size_t i = 0; i < ps->n && st == KILN_OK; i++) {
		entry *e = &ps->ents[i];
		kiln_tensor *t = kiln_tensor_new(e->dt, e->rank, e->shape);
		if (!t) {
			st = rt_seterr(ps->err, KILN_ENOMEM, "%s: tensor '" NAME_FMT "': out of "
			               "memory", ps->path, e->name);
			break;
		}
		s->items[s->count++] = (kiln_named_tensor){e->name, t};
		e->name = NULL; /* the set owns it now */
		st = rt_pread(fd, t->data, e->end - e->begin, data_off + e->begin, ps->path,
		              ps->err);
		rt_fix_bool(t);
	}
	if (st != KILN_OK) {
		kiln_tensor_set_free(s);
		return st;
	}
	*out = s;
	return KILN_OK;
}

KILN_API kiln_status kiln_safetensors_read(const char *path, kiln_tensor_set **out,
                                           kiln_error *err)
{
	if (!out)
		return rt_seterr(err, KILN_EINVAL, "safetensors read: out is NULL");
	*out = NULL;
	int fd;
	uint64_t fsize = 0, bufsize = 0;
	kiln_status st = rt_open_read(path, &fd, &fsize, err);
	if (st != KILN_OK)
		return st;
	parser ps = {.path = path, .err = err};
	char *text = NULL;
	st = read_header(fd, fsize, &ps, &text, &bufsize);
	if (st == KILN_OK)
		st = parse(&ps, bufsize);
	if (st == KILN_OK)
		st = check_set(&ps);
	if (st == KILN_OK)
		st = load(&ps, fd, fsize - bufsize, out);
	for (size_t i = 0; i < ps.n; i++)
		free(ps.ents[i].name);
	free(ps.ents);
	free(text);
	close(fd);
	return st;
}

/* ---- writing ----------------------------------------------------------- */

typedef struct sbuf {
	char *p;
	size_t n, cap;
	bool oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->cap - b->n < n) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap - b->n < n && cap < SIZE_MAX / 2)
			cap *= 2;
		char *p = cap - b->n >= n ? realloc(b->p, cap) : NULL;
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p, b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
}

static void puts_(sbuf *b, const char *s)
{
	put(b, s, strlen(s));
}

static void putu(sbuf *b, unsigned long long v)
{
	char num[24];
	put(b, num, (size_t)snprintf(num, sizeof num, "%llu", v));
}

/* A JSON string escaped as serde_json does: the short escapes where JSON has
 * them, \u00XX (lowercase) for other control characters, UTF-8 as is. */
static void putjs(sbuf *b, const char *s)
{
	put(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		const char *short_ = *p == '"' ? "\\\"" : *p == '\\' ? "\\\\" : *p == '\b' ? "\\b"
			: *p == '\f' ? "\\f" : *p == '\n' ? "\\n" : *p == '\r' ? "\\r"
			: *p == '\t' ? "\\t" : NULL;
		char u[8];
		if (short_)
			puts_(b, short_);
		else if (*p < 0x20)
			put(b, u, (size_t)snprintf(u, sizeof u, "\\u%04x", *p));
		else
			put(b, (const char *)p, 1);
	}
	put(b, "\"", 1);
}

static bool utf8_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	for (int n; p < end; p += n)
		if ((n = utf8_len(p, end)) == 0)
			return false;
	return true;
}

/* The library's write order: descending dtype enum position, then name. */
static int write_order(const void *a, const void *b)
{
	const kiln_named_tensor *x = *(const kiln_named_tensor *const *)a;
	const kiln_named_tensor *y = *(const kiln_named_tensor *const *)b;
	int ox = st_dtypes[x->tensor->dtype].order, oy = st_dtypes[y->tensor->dtype].order;
	return ox != oy ? oy - ox : strcmp(x->name, y->name);
}

static int name_order(const void *a, const void *b)
{
	return strcmp((*(const kiln_named_tensor *const *)a)->name,
	              (*(const kiln_named_tensor *const *)b)->name);
}

/* Checks every item can be written and sorts them into write order. */
static kiln_status sorted_items(const char *path, const kiln_tensor_set *s,
                                const kiln_named_tensor ***out, kiln_error *err)
{
	size_t n = (size_t)s->count, nbytes;
	const kiln_named_tensor **v = malloc((n ? n : 1) * sizeof *v);
	if (!v)
		return rt_seterr(err, KILN_ENOMEM, "%s: out of memory", path);
	kiln_status st = KILN_OK;
	for (size_t i = 0; i < n && st == KILN_OK; i++) {
		const kiln_named_tensor *it = v[i] = &s->items[i];
		const kiln_tensor *t = it->tensor;
		if (!it->name || !utf8_ok(it->name) || strcmp(it->name, "__metadata__") == 0)
			st = rt_seterr(err, KILN_EINVAL, "%s: item %zu: name is NULL, not UTF-8 or "
			               "reserved", path, i);
		else if (!t || !rt_shape_bytes(t->dtype, t->rank, t->shape, &nbytes) ||
		         (nbytes && !t->data))
			st = rt_seterr(err, KILN_EINVAL, "%s: tensor '" NAME_FMT "' is malformed",
			               path, it->name);
	}
	if (st == KILN_OK)
		qsort(v, n, sizeof *v, name_order);
	for (size_t i = 1; i < n && st == KILN_OK; i++)
		if (strcmp(v[i - 1]->name, v[i]->name) == 0)
			st = rt_seterr(err, KILN_EINVAL, "%s: duplicate tensor name '" NAME_FMT "'",
			               path, v[i]->name);
	if (st != KILN_OK) {
		free(v);
		return st;
	}
	qsort(v, n, sizeof *v, write_order);
	*out = v;
	return KILN_OK;
}

/* Builds length prefix plus padded JSON header for items v in that order. */
static void header(sbuf *b, const kiln_named_tensor **v, size_t n)
{
	put(b, "\0\0\0\0\0\0\0\0{", 9);
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++) {
		const kiln_tensor *t = v[i]->tensor;
		size_t nbytes = kiln_tensor_nbytes(t);
		if (i)
			put(b, ",", 1);
		putjs(b, v[i]->name);
		puts_(b, ":{\"dtype\":\"");
		puts_(b, st_dtypes[t->dtype].name);
		puts_(b, "\",\"shape\":[");
		for (int k = 0; k < t->rank; k++) {
			if (k)
				put(b, ",", 1);
			putu(b, (unsigned long long)t->shape[k]);
		}
		puts_(b, "],\"data_offsets\":[");
		putu(b, off);
		put(b, ",", 1);
		putu(b, off += nbytes);
		puts_(b, "]}");
	}
	put(b, "}", 1);
	while (!b->oom && b->n % 8)
		put(b, " ", 1);
	for (int i = 0; !b->oom && i < 8; i++)
		b->p[i] = (char)((uint64_t)(b->n - 8) >> (8 * i));
}

KILN_API kiln_status kiln_safetensors_write(const char *path, const kiln_tensor_set *s,
                                            kiln_error *err)
{
	if (!path || !s || s->count < 0 || (s->count && !s->items))
		return rt_seterr(err, KILN_EINVAL, "safetensors write: %s", !path ? "path is NULL"
		                 : "bad tensor set");
	const kiln_named_tensor **v = NULL;
	kiln_status st = sorted_items(path, s, &v, err);
	if (st != KILN_OK)
		return st;
	size_t n = (size_t)s->count;
	sbuf b = {0};
	header(&b, v, n);
	rt_chunk *chunks = b.oom ? NULL : malloc((n + 1) * sizeof *chunks);
	if (!chunks) {
		st = rt_seterr(err, KILN_ENOMEM, "%s: out of memory", path);
	} else {
		chunks[0] = (rt_chunk){b.p, b.n};
		for (size_t i = 0; i < n; i++)
			chunks[i + 1] = (rt_chunk){v[i]->tensor->data, kiln_tensor_nbytes(v[i]->tensor)};
		st = rt_write_atomicv(path, chunks, (int)n + 1, err);
	}
	free(chunks);
	free(b.p);
	free(v);
	return st;
}
