/*
 * npy.c: NumPy .npy files, read (format versions 1.0, 2.0 and 3.0) and
 * written (1.0).
 *
 * A file is the magic "\x93NUMPY", a major and minor version byte, the
 * header length (u16 in 1.0, u32 later), then a header that is a Python
 * dict literal, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and a newline, then the raw data.  The reader parses
 * exactly that literal: quoted keys, a string, True/False or a tuple of
 * ints as values.  Every length in the file is checked against the file's
 * size before anything is allocated, so a hostile file costs at most its
 * own size in memory.
 *
 * Choices the format leaves open:
 * - bf16 has no NumPy dtype.  It is written as '|V2', two opaque bytes:
 *   NumPy loads that as dtype V2 (and saves it back the same way), and
 *   ml_dtypes users can .view() it as bfloat16.  '|V2' and '<V2' (what
 *   ml_dtypes' bfloat16 may be saved as) read back as bf16.
 * - fortran_order True (what np.save writes for a transposed array) is
 *   accepted: the data is transposed into kiln's row-major layout.
 * - Big-endian data is rejected (KILN_EUNSUPPORTED); one-byte types are
 *   accepted with any byte-order mark, since they have no byte order.
 * - Data must fill the file exactly; trailing bytes are an error, as they
 *   mean the header and the file disagree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

static const char MAGIC[6] = "\x93NUMPY";
#define ALIGN 64 /* NumPy aligns the data to 64 bytes; so do we */

/* descr without its byte-order mark, per dtype. */
static const struct {
	kiln_dtype dt;
	const char *code;
} codes[] = {
	{KILN_F32, "f4"}, {KILN_F64, "f8"}, {KILN_F16, "f2"}, {KILN_BF16, "V2"},
	{KILN_I8, "i1"},  {KILN_U8, "u1"},  {KILN_I32, "i4"}, {KILN_I64, "i8"},
	{KILN_BOOL, "b1"},
};

/* ---- the header dict --------------------------------------------------- */

typedef struct hdr {
	const char *s, *p, *end; /* header text and cursor */
	const char *path;
	kiln_error *err;
	char descr[32];
	bool fortran;
	int rank;
	int64_t shape[KILN_MAX_RANK];
	unsigned seen; /* 1 descr, 2 fortran_order, 4 shape */
} hdr;

static kiln_status bad(hdr *h, kiln_status code, const char *what)
{
	return rt_seterr(h->err, code, "%s: npy header, offset %td: %s", h->path,
	                 h->p - h->s, what);
}

static void ws(hdr *h)
{
	while (h->p < h->end && strchr(" \t\r\n", *h->p) && *h->p)
		h->p++;
}

static bool eat(hdr *h, char c)
{
	ws(h);
	if (h->p < h->end && *h->p == c) {
		h->p++;
		return true;
	}
	return false;
}

/* pystr := "'" chars "'" | '"' chars '"'   (no escapes: npy never needs them) */
static kiln_status pystr(hdr *h, char *buf, size_t size)
{
	ws(h);
	if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
		return bad(h, KILN_EPARSE, "expected a quoted string");
	char q = *h->p++;
	size_t n = 0;
	for (; h->p < h->end && *h->p != q; h->p++) {
		if (*h->p == '\\' || *h->p == '\n' || *h->p == '\0')
			return bad(h, KILN_EPARSE, "unsupported character in string");
		if (n + 1 >= size)
			return bad(h, KILN_EPARSE, "string too long");
		buf[n++] = *h->p;
	}
	if (h->p >= h->end)
		return bad(h, KILN_EPARSE, "unterminated string");
	h->p++;
	buf[n] = '\0';
	return KILN_OK;
}

/* dim := digits ['L']   (Python 2 wrote longs with an L) */
static kiln_status dim(hdr *h, int64_t *out)
{
	ws(h);
	if (h->p < h->end && *h->p == '-')
		return bad(h, KILN_EPARSE, "negative dimension");
	if (h->p >= h->end || *h->p < '0' || *h->p > '9')
		return bad(h, KILN_EPARSE, "expected a dimension");
	int64_t v = 0;
	for (; h->p < h->end && *h->p >= '0' && *h->p <= '9'; h->p++) {
		if (v > (INT64_MAX - (*h->p - '0')) / 10)
			return bad(h, KILN_EPARSE, "dimension too large");
		v = v * 10 + (*h->p - '0');
	}
	if (h->p < h->end && *h->p == 'L')
		h->p++;
	*out = v;
	return KILN_OK;
}

/* shape := '(' ')' | '(' dim ',' ')' | '(' dim (',' dim)+ [','] ')' */
static kiln_status shape(hdr *h)
{
	kiln_status st;
	if (!eat(h, '('))
		return bad(h, KILN_EPARSE, "shape must be a tuple");
	bool comma = false;
	for (h->rank = 0; !eat(h, ')'); h->rank++) {
		if (h->rank == KILN_MAX_RANK)
			return bad(h, KILN_EUNSUPPORTED, "rank exceeds KILN_MAX_RANK (8)");
		if ((st = dim(h, &h->shape[h->rank])) != KILN_OK)
			return st;
		comma = eat(h, ',');
		if (!comma) {
			if (!eat(h, ')'))
				return bad(h, KILN_EPARSE, "expected ',' or ')' in shape");
			h->rank++;
			break;
		}
	}
	/* (3) is the int 3 in Python, not a tuple */
	if (h->rank == 1 && !comma)
		return bad(h, KILN_EPARSE, "shape must be a tuple");
	return KILN_OK;
}

static kiln_status boolean(hdr *h, bool *out)
{
	ws(h);
	size_t left = (size_t)(h->end - h->p);
	if (left >= 4 && memcmp(h->p, "True", 4) == 0) {
		h->p += 4, *out = true;
		return KILN_OK;
	}
	if (left >= 5 && memcmp(h->p, "False", 5) == 0) {
		h->p += 5, *out = false;
		return KILN_OK;
	}
	return bad(h, KILN_EPARSE, "fortran_order must be True or False");
}

/* item := pystr ':' value, with the value's form fixed by the key */
static kiln_status item(hdr *h)
{
	char key[32];
	kiln_status st = pystr(h, key, sizeof key);
	if (st != KILN_OK)
		return st;
	static const char *const keys[] = {"descr", "fortran_order", "shape"};
	int k = 0;
	while (k < 3 && strcmp(key, keys[k]) != 0)
		k++;
	if (k == 3)
		return bad(h, KILN_EPARSE, "unknown key (want descr, fortran_order, shape)");
	if (h->seen & (1u << k))
		return bad(h, KILN_EPARSE, "duplicate key");
	h->seen |= 1u << k;
	if (!eat(h, ':'))
		return bad(h, KILN_EPARSE, "expected ':'");
	if (k == 0 && eat(h, '['))
		return bad(h, KILN_EUNSUPPORTED, "structured dtypes are not supported");
	if (k == 0)
		return pystr(h, h->descr, sizeof h->descr);
	return k == 1 ? boolean(h, &h->fortran) : shape(h);
}

/* header := '{' [item (',' item)* [',']] '}' whitespace* */
static kiln_status parse_header(hdr *h)
{
	kiln_status st;
	if (!eat(h, '{'))
		return bad(h, KILN_EPARSE, "expected '{'");
	while (!eat(h, '}')) {
		if ((st = item(h)) != KILN_OK)
			return st;
		if (!eat(h, ',')) {
			if (!eat(h, '}'))
				return bad(h, KILN_EPARSE, "expected ',' or '}'");
			break;
		}
	}
	ws(h);
	if (h->p != h->end)
		return bad(h, KILN_EPARSE, "junk after the dict");
	if (h->seen != 7)
		return bad(h, KILN_EPARSE, "missing key (need descr, fortran_order, shape)");
	return KILN_OK;
}

/* ---- dtypes ------------------------------------------------------------ */

static kiln_status dtype_of(hdr *h, kiln_dtype *out)
{
	const char *d = h->descr;
	for (size_t i = 0; d[0] && i < sizeof codes / sizeof codes[0]; i++) {
		if (strcmp(d + 1, codes[i].code) != 0)
			continue;
		size_t size = kiln_dtype_size(codes[i].dt);
		bool ok = d[0] == '<' || (d[0] == '|' && (size == 1 || d[1] == 'V')) ||
		          (size == 1 && strchr(">=", d[0]));
		if (!ok && d[0] == '>')
			return rt_seterr(h->err, KILN_EUNSUPPORTED,
			                 "%s: npy dtype '%s' is big-endian; only little-endian "
			                 "is supported", h->path, d);
		if (!ok)
			break;
		*out = codes[i].dt;
		return KILN_OK;
	}
	return rt_seterr(h->err, KILN_EUNSUPPORTED,
	                 "%s: npy dtype '%s' is not supported (kiln reads f4 f8 f2 V2(bf16) "
	                 "i1 u1 i4 i8 b1)", h->path, d);
}

/* ---- reading ----------------------------------------------------------- */

/* Reads the magic, version and header text; *data_off is where data starts. */
static kiln_status read_header(int fd, uint64_t fsize, hdr *h, char **text,
                               uint64_t *data_off)
{
	unsigned char pre[12];
	const char *path = h->path;
	if (fsize < 10)
		return rt_seterr(h->err, KILN_EPARSE, "%s: too short for an npy file (%llu bytes)",
		                 path, (unsigned long long)fsize);
	kiln_status st = rt_pread(fd, pre, fsize < 12 ? 10 : 12, 0, path, h->err);
	if (st != KILN_OK)
		return st;
	if (memcmp(pre, MAGIC, 6) != 0)
		return rt_seterr(h->err, KILN_EPARSE, "%s: not an npy file (bad magic)", path);
	if (pre[6] < 1 || pre[6] > 3)
		return rt_seterr(h->err, KILN_EUNSUPPORTED, "%s: npy format version %u.%u "
		                 "is not supported", path, pre[6], pre[7]);
	uint64_t hlen = pre[8] | (uint64_t)pre[9] << 8, pre_len = 10;
	if (pre[6] > 1) {
		if (fsize < 12)
			return rt_seterr(h->err, KILN_EPARSE, "%s: npy preamble truncated", path);
		hlen |= (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
		pre_len = 12;
	}
	if (hlen > fsize - pre_len)
		return rt_seterr(h->err, KILN_EPARSE, "%s: npy header length %llu runs past "
		                 "the end of the file (%llu bytes)", path,
		                 (unsigned long long)hlen, (unsigned long long)fsize);
	if (!(*text = malloc(hlen + 1)))
		return rt_seterr(h->err, KILN_ENOMEM, "%s: out of memory", path);
	if ((st = rt_pread(fd, *text, hlen, pre_len, path, h->err)) != KILN_OK)
		return st;
	(*text)[hlen] = '\0';
	h->s = h->p = *text;
	h->end = *text + hlen;
	*data_off = pre_len + hlen;
	return KILN_OK;
}

/* Reorders column-major src into t's row-major data.  Column-major strides
 * grow from the first axis; an odometer over t's indices, last axis fastest,
 * tracks the matching element of src. */
static void from_fortran(kiln_tensor *t, const char *src)
{
	size_t es = kiln_dtype_size(t->dtype), n = kiln_tensor_nbytes(t) / es;
	int64_t idx[KILN_MAX_RANK] = {0}, stride[KILN_MAX_RANK];
	for (int k = 0; k < t->rank; k++)
		stride[k] = k == 0 ? 1 : stride[k - 1] * t->shape[k - 1];
	char *dst = t->data;
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(dst + i * es, src + off * es, es);
		for (int k = t->rank - 1; k >= 0; k--) {
			off += (size_t)stride[k];
			if (++idx[k] < t->shape[k])
				break;
			off -= (size_t)(stride[k] * t->shape[k]);
			idx[k] = 0;
		}
	}
}

/* Reads the data that follows the header into a new tensor. */
static kiln_status read_data(int fd, uint64_t fsize, uint64_t off, hdr *h, kiln_dtype dt,
                             kiln_tensor **out)
{
	size_t nbytes;
	if (!rt_shape_bytes(dt, h->rank, h->shape, &nbytes))
		return rt_seterr(h->err, KILN_EPARSE, "%s: npy shape is too large", h->path);
	if (nbytes != fsize - off)
		return rt_seterr(h->err, KILN_EPARSE, "%s: npy data is %llu bytes but shape "
		                 "and dtype '%s' need %zu", h->path,
		                 (unsigned long long)(fsize - off), h->descr, nbytes);
	/* Column-major data is read aside, then reordered into t. */
	bool transpose = h->fortran && h->rank > 1 && nbytes > 0;
	kiln_tensor *t = kiln_tensor_new(dt, h->rank, h->shape);
	char *raw = transpose ? malloc(nbytes) : NULL;
	kiln_status st = KILN_ENOMEM;
	if (!t || (transpose && !raw))
		rt_seterr(h->err, st, "%s: out of memory for %zu bytes of data", h->path, nbytes);
	else
		st = rt_pread(fd, transpose ? raw : t->data, nbytes, off, h->path, h->err);
	if (st == KILN_OK && transpose)
		from_fortran(t, raw);
	free(raw);
	if (st != KILN_OK) {
		kiln_tensor_free(t);
		return st;
	}
	rt_fix_bool(t);
	*out = t;
	return KILN_OK;
}

KILN_API kiln_status kiln_npy_read(const char *path, kiln_tensor **out, kiln_error *err)
{
	if (!out)
		return rt_seterr(err, KILN_EINVAL, "npy read: out is NULL");
	*out = NULL;
	int fd;
	uint64_t fsize = 0, data_off = 0;
	kiln_status st = rt_open_read(path, &fd, &fsize, err);
	if (st != KILN_OK)
		return st;
	hdr h = {.path = path, .err = err};
	char *text = NULL;
	kiln_dtype dt = KILN_DT_INVALID;
	st = read_header(fd, fsize, &h, &text, &data_off);
	if (st == KILN_OK)
		st = parse_header(&h);
	if (st == KILN_OK)
		st = dtype_of(&h, &dt);
	if (st == KILN_OK)
		st = read_data(fd, fsize, data_off, &h, dt, out);
	free(text);
	close(fd);
	return st;
}

/* ---- writing ----------------------------------------------------------- */

/* Formats the header as NumPy does, padded so the data starts 64-aligned. */
static size_t format_header(const kiln_tensor *t, char *buf, size_t size)
{
	const char *code = "";
	for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
		if (codes[i].dt == t->dtype)
			code = codes[i].code;
	/* NumPy's own marks: no byte order for single bytes and opaque voids */
	char order = kiln_dtype_size(t->dtype) == 1 || t->dtype == KILN_BF16 ? '|' : '<';
	int n = snprintf(buf + 10, size - 10, "{'descr': '%c%s', 'fortran_order': False, "
	                 "'shape': (", order, code);
	for (int i = 0; i < t->rank; i++)
		n += snprintf(buf + 10 + n, size - 10 - (size_t)n, "%s%lld", i ? ", " : "",
		              (long long)t->shape[i]);
	n += snprintf(buf + 10 + n, size - 10 - (size_t)n, "%s), }", t->rank == 1 ? "," : "");
	size_t total = (10 + (size_t)n + 1 + ALIGN - 1) / ALIGN * ALIGN;
	memset(buf + 10 + n, ' ', total - 10 - (size_t)n - 1);
	buf[total - 1] = '\n';
	memcpy(buf, MAGIC, 6);
	buf[6] = 1, buf[7] = 0;
	buf[8] = (char)((total - 10) & 0xff), buf[9] = (char)((total - 10) >> 8);
	return total;
}

KILN_API kiln_status kiln_npy_write(const char *path, const kiln_tensor *t, kiln_error *err)
{
	size_t nbytes;
	if (!path || !t)
		return rt_seterr(err, KILN_EINVAL, "npy write: %s is NULL", path ? "tensor" : "path");
	if (!rt_shape_bytes(t->dtype, t->rank, t->shape, &nbytes) || (nbytes && !t->data))
		return rt_seterr(err, KILN_EINVAL, "%s: npy write: malformed tensor", path);
	/* rank 8 with 19-digit dims is under 300 bytes */
	char buf[512];
	size_t hlen = format_header(t, buf, sizeof buf);
	rt_chunk chunks[2] = {{buf, hlen}, {t->data, nbytes}};
	return rt_write_atomicv(path, chunks, 2, err);
}
