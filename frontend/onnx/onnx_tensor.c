/*
 * onnx_tensor.c: ONNX data types and TensorProto data as kiln tensors, for
 * initializers, Constant values and test data.
 *
 * Data comes from one of three places: the typed repeated fields (where
 * int32_data also carries i8, u8, bool and the bit patterns of f16/bf16),
 * little-endian raw_data, or an external file next to the model.  Every
 * size is checked against the data actually present before a byte is
 * allocated, so a hostile shape cannot make the importer allocate more
 * than the file holds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/onnx/onnx.h"
#include "runtime/rt.h"

/* ---- dtypes --------------------------------------------------------------- */

static const kiln_dtype from_onnx[] = {
	[ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT] = KILN_F32,
	[ONNX__TENSOR_PROTO__DATA_TYPE__UINT8] = KILN_U8,
	[ONNX__TENSOR_PROTO__DATA_TYPE__INT8] = KILN_I8,
	[ONNX__TENSOR_PROTO__DATA_TYPE__INT32] = KILN_I32,
	[ONNX__TENSOR_PROTO__DATA_TYPE__INT64] = KILN_I64,
	[ONNX__TENSOR_PROTO__DATA_TYPE__BOOL] = KILN_BOOL,
	[ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16] = KILN_F16,
	[ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE] = KILN_F64,
	[ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16] = KILN_BF16,
};

static const char *const onnx_names[] = {
	"UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64",
	"STRING", "BOOL", "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64",
	"COMPLEX128", "BFLOAT16",
};

kiln_dtype onnx_dtype_to_kiln(int32_t t)
{
	size_t n = sizeof from_onnx / sizeof *from_onnx;
	return t >= 0 && (size_t)t < n ? from_onnx[t] : KILN_DT_INVALID;
}

int32_t onnx_dtype_from_kiln(kiln_dtype dt)
{
	for (size_t t = 0; t < sizeof from_onnx / sizeof *from_onnx; t++)
		if (from_onnx[t] == dt && dt != KILN_DT_INVALID)
			return (int32_t)t;
	return 0;
}

const char *onnx_dtype_name(int32_t t)
{
	size_t n = sizeof onnx_names / sizeof *onnx_names;
	return t >= 0 && (size_t)t < n ? onnx_names[t] : "unknown";
}

/* ---- tensors ---------------------------------------------------------------- */

static const char *tname(const Onnx__TensorProto *tp)
{
	return tp->name && *tp->name ? tp->name : "(unnamed)";
}

/* Element count, checked: rank, non-negative dims, at most 2^40 elements. */
static kiln_status tensor_numel(const Onnx__TensorProto *tp, int64_t *numel, kiln_error *err)
{
	if (tp->n_dims > KILN_MAX_RANK)
		return ir_seterr(err, KILN_EUNSUPPORTED, "tensor '%s' has rank %zu; kiln allows %d",
		                 tname(tp), tp->n_dims, KILN_MAX_RANK);
	uint64_t n = 1;
	for (size_t i = 0; i < tp->n_dims; i++) {
		uint64_t d = (uint64_t)tp->dims[i];
		if (tp->dims[i] < 0 || (d && n > (UINT64_C(1) << 40) / d))
			return ir_seterr(err, KILN_EPARSE, "tensor '%s': dim %zu (%lld) is negative or "
			                 "the size is too large", tname(tp), i, (long long)tp->dims[i]);
		n *= d;
	}
	*numel = (int64_t)n;
	return KILN_OK;
}

/* external_data's location, offset and length; the location is checked
 * against the model's folder when the file is opened (rt_open_read_in). */
static kiln_status external_ref(const Onnx__TensorProto *tp, const char *dir, const char **loc,
                                int64_t *off, int64_t *len, kiln_error *err)
{
	*loc = NULL;
	*off = 0, *len = -1;
	for (size_t i = 0; i < tp->n_external_data; i++) {
		const Onnx__StringStringEntryProto *e = tp->external_data[i];
		if (!e->key || !e->value)
			continue;
		if (!strcmp(e->key, "location"))
			*loc = e->value;
		else if (!strcmp(e->key, "offset"))
			*off = strtoll(e->value, NULL, 10);
		else if (!strcmp(e->key, "length"))
			*len = strtoll(e->value, NULL, 10);
	}
	if (!dir)
		return ir_seterr(err, KILN_EUNSUPPORTED, "tensor '%s': external data needs the "
		                 "model's folder (import from a file)", tname(tp));
	if (!*loc || !**loc)
		return ir_seterr(err, KILN_EINVAL, "tensor '%s': external data location '' must "
		                 "be a relative path inside the model's folder", tname(tp));
	if (*off < 0 || *len < -1)
		return ir_seterr(err, KILN_EINVAL, "tensor '%s': negative external data offset or "
		                 "length", tname(tp));
	return KILN_OK;
}

/* Reads the tensor's bytes from its external file, which must be a regular
 * file whose real path (symbolic links resolved) lies inside dir's. */
static kiln_status read_external(const Onnx__TensorProto *tp, const char *dir, size_t nbytes,
                                 kiln_tensor *t, kiln_error *err)
{
	const char *loc;
	int64_t off, len;
	kiln_status st = external_ref(tp, dir, &loc, &off, &len, err);
	if (st)
		return st;
	if (len >= 0 && (uint64_t)len != nbytes)
		return ir_seterr(err, KILN_EPARSE, "tensor '%s': external length %lld, but its "
		                 "shape needs %zu bytes", tname(tp), (long long)len, nbytes);
	int fd;
	uint64_t size;
	kiln_error e = {0};
	if ((st = rt_open_read_in(dir, loc, &fd, &size, &e)) != KILN_OK)
		return ir_seterr(err, st, "tensor '%s': cannot read external data: %s", tname(tp),
		                 e.msg);
	if ((uint64_t)off > size || nbytes > size - (uint64_t)off)
		st = ir_seterr(err, KILN_EIO, "tensor '%s': external data '%s/%s' has no %zu bytes "
		               "at offset %lld", tname(tp), dir, loc, nbytes, (long long)off);
	else if ((st = rt_pread(fd, t->data, nbytes, (uint64_t)off, loc, &e)) != KILN_OK)
		st = ir_seterr(err, st, "tensor '%s': %s", tname(tp), e.msg);
	close(fd);
	return st;
}

/* The typed field holding this dtype's data, as (count, pointer, width). */
static bool typed_field(const Onnx__TensorProto *tp, kiln_dtype dt, size_t *cnt,
                        const void **p, int *width)
{
	switch (dt) {
	case KILN_F32: *cnt = tp->n_float_data, *p = tp->float_data, *width = 4; return true;
	case KILN_F64: *cnt = tp->n_double_data, *p = tp->double_data, *width = 8; return true;
	case KILN_I64: *cnt = tp->n_int64_data, *p = tp->int64_data, *width = 8; return true;
	case KILN_DT_INVALID: case KILN_DT_COUNT: return false;
	default: /* int32_data holds i32, i8, u8, bool and f16/bf16 bit patterns */
		*cnt = tp->n_int32_data, *p = tp->int32_data, *width = -4;
		return true;
	}
}

/* Copies a typed field into t, narrowing int32_data to t's element size. */
static void copy_typed(kiln_tensor *t, const void *p, int width, int64_t n)
{
	size_t es = kiln_dtype_size(t->dtype);
	if (width > 0) {
		memcpy(t->data, p, (size_t)n * es);
		return;
	}
	const int32_t *s = p;
	for (int64_t i = 0; i < n; i++) {
		if (es == 4)
			((int32_t *)t->data)[i] = s[i];
		else if (es == 2)
			((uint16_t *)t->data)[i] = (uint16_t)s[i];
		else
			((uint8_t *)t->data)[i] = t->dtype == KILN_BOOL ? s[i] != 0 : (uint8_t)s[i];
	}
}

/* raw_data is little-endian, as is every host kiln builds on (x86-64, arm64). */
kiln_status onnx_tensor_read(const Onnx__TensorProto *tp, const char *dir, kiln_tensor **out,
                             kiln_error *err)
{
	*out = NULL;
	kiln_dtype dt = onnx_dtype_to_kiln(tp->data_type);
	int64_t n = 0;
	if (dt == KILN_DT_INVALID)
		return ir_seterr(err, KILN_EUNSUPPORTED, "tensor '%s' has data type %s, which kiln "
		                 "does not support", tname(tp), onnx_dtype_name(tp->data_type));
	kiln_status st = tensor_numel(tp, &n, err);
	if (st)
		return st;
	size_t es = kiln_dtype_size(dt), nbytes = (size_t)n * es, cnt = 0;
	const void *p = NULL;
	int width = 0;
	bool external = tp->has_data_location &&
	                tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
	if (!external && tp->has_raw_data && tp->raw_data.len != nbytes)
		return ir_seterr(err, KILN_EPARSE, "tensor '%s': raw_data has %zu bytes, its shape "
		                 "needs %zu", tname(tp), tp->raw_data.len, nbytes);
	if (!external && !tp->has_raw_data && typed_field(tp, dt, &cnt, &p, &width) &&
	    cnt != (size_t)n)
		return ir_seterr(err, KILN_EPARSE, "tensor '%s': %zu values for %lld elements",
		                 tname(tp), cnt, (long long)n);
	int64_t shape[KILN_MAX_RANK];
	for (size_t i = 0; i < tp->n_dims; i++)
		shape[i] = tp->dims[i];
	kiln_tensor *t = kiln_tensor_new(dt, (int)tp->n_dims, shape);
	if (!t)
		return ir_seterr(err, KILN_ENOMEM, "tensor '%s': out of memory", tname(tp));
	if (external)
		st = read_external(tp, dir, nbytes, t, err);
	else if (tp->has_raw_data && nbytes)
		memcpy(t->data, tp->raw_data.data, nbytes);
	else if (n)
		copy_typed(t, p, width, n);
	if (st)
		kiln_tensor_free(t);
	else
		*out = t;
	return st;
}
