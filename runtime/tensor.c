/*
 * tensor.c: status strings, dtypes, dense tensors and named tensor sets.
 *
 * A tensor is one allocation: the kiln_tensor header, padded to 64 bytes,
 * then the zeroed data, so t->data is 64-byte aligned and kiln_tensor_free
 * is a single free().  Every size is checked before it is computed: a shape
 * whose element count or byte size would overflow (or exceed PTRDIFF_MAX,
 * the most one object may hold) yields NULL, never a short buffer.
 *
 * A tensor set is a flat array searched linearly.  State dicts hold
 * hundreds of tensors, not millions, and a plain array keeps the public
 * struct honest: items really holds count entries, with no hidden capacity
 * that a caller building a set by hand could contradict.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

#define ALIGN 64
/* The header's footprint, rounded up so the data after it stays aligned. */
#define HDR_BYTES ((sizeof(kiln_tensor) + ALIGN - 1) / ALIGN * ALIGN)

/* ---- status and errors ------------------------------------------------- */

KILN_API const char *kiln_status_str(kiln_status st)
{
	switch (st) {
	case KILN_OK: return "ok";
	case KILN_EINVAL: return "invalid argument";
	case KILN_ESHAPE: return "shape error";
	case KILN_EUNSUPPORTED: return "unsupported";
	case KILN_EPARSE: return "parse error";
	case KILN_ENOMEM: return "out of memory";
	case KILN_EIO: return "I/O error";
	case KILN_EVERIFY: return "verification failed";
	}
	return "unknown status";
}

kiln_status rt_seterr(kiln_error *err, kiln_status code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		err->code = code;
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
	const char *name;
	size_t size;
	bool is_float;
} dtypes[KILN_DT_COUNT] = {
	[KILN_F32] = {"f32", 4, true},  [KILN_F64] = {"f64", 8, true},
	[KILN_F16] = {"f16", 2, true},  [KILN_BF16] = {"bf16", 2, true},
	[KILN_I8] = {"i8", 1, false},   [KILN_U8] = {"u8", 1, false},
	[KILN_I32] = {"i32", 4, false}, [KILN_I64] = {"i64", 8, false},
	[KILN_BOOL] = {"bool", 1, false},
};

static bool dtype_ok(kiln_dtype dt)
{
	return dt > KILN_DT_INVALID && dt < KILN_DT_COUNT;
}

KILN_API size_t kiln_dtype_size(kiln_dtype dt)
{
	return dtype_ok(dt) ? dtypes[dt].size : 0;
}

KILN_API const char *kiln_dtype_name(kiln_dtype dt)
{
	return dtype_ok(dt) ? dtypes[dt].name : "invalid";
}

KILN_API kiln_dtype kiln_dtype_from_name(const char *name)
{
	for (int dt = KILN_DT_INVALID + 1; name && dt < KILN_DT_COUNT; dt++)
		if (strcmp(name, dtypes[dt].name) == 0)
			return (kiln_dtype)dt;
	return KILN_DT_INVALID;
}

KILN_API bool kiln_dtype_is_float(kiln_dtype dt)
{
	return dtype_ok(dt) && dtypes[dt].is_float;
}

/* ---- tensors ----------------------------------------------------------- */

bool rt_shape_bytes(kiln_dtype dt, int rank, const int64_t *shape, size_t *nbytes)
{
	if (!dtype_ok(dt) || rank < 0 || rank > KILN_MAX_RANK || (rank > 0 && !shape))
		return false;
	/* The most elements that still leave room for the header and padding. */
	uint64_t limit = ((uint64_t)PTRDIFF_MAX - HDR_BYTES - ALIGN) / dtypes[dt].size;
	bool empty = false; /* a zero dim makes any shape empty, however large */
	for (int i = 0; i < rank; i++) {
		if (shape[i] < 0)
			return false;
		empty |= shape[i] == 0;
	}
	uint64_t n = !empty;
	for (int i = 0; i < rank && !empty; i++) {
		if ((uint64_t)shape[i] > limit / n)
			return false;
		n *= (uint64_t)shape[i];
	}
	*nbytes = (size_t)(n * dtypes[dt].size);
	return true;
}

KILN_API kiln_tensor *kiln_tensor_new(kiln_dtype dt, int rank, const int64_t *shape)
{
	size_t nbytes;
	if (!rt_shape_bytes(dt, rank, shape, &nbytes))
		return NULL;
	/* aligned_alloc wants a multiple of the alignment. */
	size_t total = (HDR_BYTES + nbytes + ALIGN - 1) / ALIGN * ALIGN;
	kiln_tensor *t = aligned_alloc(ALIGN, total);
	if (!t)
		return NULL;
	memset(t, 0, total);
	t->dtype = dt;
	t->rank = rank;
	if (rank > 0)
		memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
	t->data = (char *)t + HDR_BYTES;
	return t;
}

KILN_API void kiln_tensor_free(kiln_tensor *t)
{
	free(t);
}

/* -1 for a NULL or malformed tensor (bad rank, negative dim, overflow). */
KILN_API int64_t kiln_tensor_numel(const kiln_tensor *t)
{
	size_t nbytes;
	if (!t || !rt_shape_bytes(t->dtype, t->rank, t->shape, &nbytes))
		return -1;
	return (int64_t)(nbytes / dtypes[t->dtype].size);
}

/* 0 for a NULL or malformed tensor. */
KILN_API size_t kiln_tensor_nbytes(const kiln_tensor *t)
{
	size_t nbytes;
	if (!t || !rt_shape_bytes(t->dtype, t->rank, t->shape, &nbytes))
		return 0;
	return nbytes;
}

/* Works for any well-formed tensor, including one whose data the caller
 * allocated; NULL if t is malformed or has no data to copy. */
KILN_API kiln_tensor *kiln_tensor_clone(const kiln_tensor *t)
{
	if (!t)
		return NULL;
	kiln_tensor *c = kiln_tensor_new(t->dtype, t->rank, t->shape);
	if (!c)
		return NULL;
	size_t nbytes = kiln_tensor_nbytes(c);
	if (nbytes > 0 && !t->data) {
		kiln_tensor_free(c);
		return NULL;
	}
	if (nbytes > 0)
		memcpy(c->data, t->data, nbytes);
	return c;
}

void rt_fix_bool(kiln_tensor *t)
{
	if (t->dtype != KILN_BOOL)
		return;
	unsigned char *p = t->data;
	size_t n = kiln_tensor_nbytes(t);
	for (size_t i = 0; i < n; i++)
		p[i] = p[i] != 0;
}

/* ---- tensor sets ------------------------------------------------------- */

KILN_API kiln_tensor_set *kiln_tensor_set_new(void)
{
	return calloc(1, sizeof(kiln_tensor_set));
}

static int find(const kiln_tensor_set *s, const char *name)
{
	for (int i = 0; i < s->count; i++)
		if (strcmp(s->items[i].name, name) == 0)
			return i;
	return -1;
}

/* The copy is made before anything is replaced, so a failure (or t being
 * the very tensor it replaces) leaves the set as it was. */
KILN_API kiln_status kiln_tensor_set_add(kiln_tensor_set *s, const char *name,
                                         const kiln_tensor *t)
{
	if (!s || !name || !t)
		return KILN_EINVAL;
	size_t nbytes;
	if (!rt_shape_bytes(t->dtype, t->rank, t->shape, &nbytes) || (nbytes && !t->data))
		return KILN_EINVAL;
	kiln_tensor *c = kiln_tensor_clone(t);
	if (!c)
		return KILN_ENOMEM;
	int i = find(s, name);
	if (i >= 0) {
		kiln_tensor_free(s->items[i].tensor);
		s->items[i].tensor = c;
		return KILN_OK;
	}
	char *dup = strdup(name);
	kiln_named_tensor *items = dup && s->count < INT32_MAX
		? realloc(s->items, ((size_t)s->count + 1) * sizeof *items) : NULL;
	if (!items) {
		free(dup);
		kiln_tensor_free(c);
		return KILN_ENOMEM;
	}
	s->items = items;
	s->items[s->count++] = (kiln_named_tensor){dup, c};
	return KILN_OK;
}

KILN_API const kiln_tensor *kiln_tensor_set_get(const kiln_tensor_set *s, const char *name)
{
	if (!s || !name)
		return NULL;
	int i = find(s, name);
	return i >= 0 ? s->items[i].tensor : NULL;
}

KILN_API void kiln_tensor_set_free(kiln_tensor_set *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->count; i++) {
		free(s->items[i].name);
		kiln_tensor_free(s->items[i].tensor);
	}
	free(s->items);
	free(s);
}
