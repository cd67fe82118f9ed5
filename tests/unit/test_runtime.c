/*
 * test_runtime.c: the runtime/ suite: dtypes, tensors, tensor sets, .npy
 * and .safetensors files, and atomic writes.
 *
 * Readers are tested three ways: round trips through kiln's own writers,
 * files made by the real tools (NumPy, and PyTorch tensors laid out as the
 * safetensors library lays them out; see tests/fixtures/make_npy_fixtures.py),
 * and hand-made malformed files, each of which must fail with the right
 * code and a message naming the file and the problem.  The writer's bytes
 * are compared with the Rust safetensors library's own golden vectors.
 * Every test works in a fresh mkdtemp directory that teardown removes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, nftw */
#endif
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "kiln/kiln.h"
#include "runtime/rt.h"

#ifndef KILN_FIXTURES
#error "KILN_FIXTURES must name the tests/fixtures directory"
#endif

/* ---- helpers ----------------------------------------------------------- */

static char tmpdir[512];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void setup(void)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/kiln_rt_XXXXXX", base && *base ? base : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
	nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A path in the test's directory; four rotating buffers. */
static const char *tpath(const char *name)
{
	static char bufs[4][700];
	static int next;
	char *b = bufs[next++ % 4];
	snprintf(b, sizeof bufs[0], "%s/%s", tmpdir, name);
	return b;
}

static const char *fixture(const char *name)
{
	static char buf[1024];
	snprintf(buf, sizeof buf, "%s/%s", KILN_FIXTURES, name);
	return buf;
}

static void write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

/* The whole file, malloc'd; NULL if it cannot be read. */
static unsigned char *slurp(const char *path, size_t *n)
{
	*n = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	unsigned char *buf = NULL;
	size_t cap = 0;
	for (;;) {
		if (*n == cap)
			buf = realloc(buf, cap = cap ? 2 * cap : 4096);
		size_t r = fread(buf + *n, 1, cap - *n, f);
		*n += r;
		if (r == 0)
			break;
	}
	fclose(f);
	return buf;
}

static bool file_is(const char *path, const char *text)
{
	size_t n;
	unsigned char *b = slurp(path, &n);
	bool same = b && n == strlen(text) && memcmp(b, text, n) == 0;
	free(b);
	return same;
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

/* Asserts a failure's code, that err agrees, and that the message names the
 * file (when path is non-NULL) and contains sub. */
#define EXPECT_ERR(st, err, want, path, sub)                                          \
	do {                                                                          \
		ck_assert_int_eq((st), (want));                                       \
		ck_assert_int_eq((err).code, (want));                                 \
		ck_assert_msg(strstr((err).msg, (sub)) != NULL,                       \
		              "message \"%s\" lacks \"%s\"", (err).msg, (sub));       \
		if ((path) != NULL)                                                   \
			ck_assert_msg(strstr((err).msg, (const char *)(path)) != NULL, \
			              "message \"%s\" lacks the path", (err).msg);    \
	} while (0)

/* A tensor filled with a pattern that differs per dtype and per byte; bools
 * get 0/1, the only values a bool may hold. */
static kiln_tensor *patterned(kiln_dtype dt, int rank, const int64_t *shape)
{
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	ck_assert_ptr_nonnull(t);
	unsigned char *p = t->data;
	for (size_t i = 0; i < kiln_tensor_nbytes(t); i++)
		p[i] = dt == KILN_BOOL ? i % 3 == 0 : (unsigned char)(i * 31 + dt * 7 + 1);
	return t;
}

static void assert_same_tensor(const kiln_tensor *a, const kiln_tensor *b)
{
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(a->dtype, b->dtype);
	ck_assert_int_eq(a->rank, b->rank);
	for (int i = 0; i < a->rank; i++)
		ck_assert_int_eq(a->shape[i], b->shape[i]);
	ck_assert_uint_eq(kiln_tensor_nbytes(a), kiln_tensor_nbytes(b));
	ck_assert(memcmp(a->data, b->data, kiln_tensor_nbytes(a)) == 0);
}

/* ---- dtypes ------------------------------------------------------------ */

START_TEST(dtype_names_round_trip)
{
	static const char *names[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64",
	                              "bool"};
	for (int dt = KILN_F32; dt < KILN_DT_COUNT; dt++) {
		ck_assert_str_eq(kiln_dtype_name((kiln_dtype)dt), names[dt - KILN_F32]);
		ck_assert_int_eq(kiln_dtype_from_name(names[dt - KILN_F32]), dt);
	}
	ck_assert_int_eq(kiln_dtype_from_name("f33"), KILN_DT_INVALID);
	ck_assert_int_eq(kiln_dtype_from_name(""), KILN_DT_INVALID);
	ck_assert_int_eq(kiln_dtype_from_name(NULL), KILN_DT_INVALID);
	ck_assert_str_eq(kiln_dtype_name(KILN_DT_INVALID), "invalid");
	ck_assert_str_eq(kiln_dtype_name((kiln_dtype)99), "invalid");
}
END_TEST

START_TEST(dtype_sizes_and_float_flags)
{
	static const size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 8, 1};
	for (int dt = KILN_F32; dt < KILN_DT_COUNT; dt++) {
		ck_assert_uint_eq(kiln_dtype_size((kiln_dtype)dt), sizes[dt - KILN_F32]);
		ck_assert(kiln_dtype_is_float((kiln_dtype)dt) == (dt <= KILN_BF16));
	}
	ck_assert_uint_eq(kiln_dtype_size(KILN_DT_INVALID), 0);
	ck_assert_uint_eq(kiln_dtype_size(KILN_DT_COUNT), 0);
	ck_assert(!kiln_dtype_is_float(KILN_DT_INVALID));
}
END_TEST

START_TEST(status_str_names_every_code)
{
	for (int st = KILN_OK; st <= KILN_EVERIFY; st++) {
		ck_assert_ptr_nonnull(kiln_status_str((kiln_status)st));
		ck_assert_str_ne(kiln_status_str((kiln_status)st), "unknown status");
	}
	ck_assert_str_eq(kiln_status_str(KILN_EPARSE), "parse error");
	ck_assert_str_eq(kiln_status_str((kiln_status)1000), "unknown status");
}
END_TEST

START_TEST(seterr_accepts_null_err)
{
	kiln_error err;
	ck_assert_int_eq(rt_seterr(NULL, KILN_EIO, "x %d", 1), KILN_EIO);
	ck_assert_int_eq(rt_seterr(&err, KILN_EPARSE, "%s:%d", "f", 7), KILN_EPARSE);
	ck_assert_int_eq(err.code, KILN_EPARSE);
	ck_assert_str_eq(err.msg, "f:7");
}
END_TEST

/* ---- tensors ----------------------------------------------------------- */

START_TEST(tensor_new_zeroes_and_aligns_data)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 2, (int64_t[]){3, 5});
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->dtype, KILN_F32);
	ck_assert_int_eq(t->rank, 2);
	ck_assert_int_eq(t->shape[0], 3);
	ck_assert_int_eq(t->shape[1], 5);
	ck_assert_uint_eq((uintptr_t)t->data % 64, 0);
	ck_assert_int_eq(kiln_tensor_numel(t), 15);
	ck_assert_uint_eq(kiln_tensor_nbytes(t), 60);
	for (int i = 0; i < 15; i++)
		ck_assert(((float *)t->data)[i] == 0.0f);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(tensor_new_rank0_is_one_element)
{
	kiln_tensor *t = kiln_tensor_new(KILN_I64, 0, NULL);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(kiln_tensor_numel(t), 1);
	ck_assert_uint_eq(kiln_tensor_nbytes(t), 8);
	*(int64_t *)t->data = -3; /* writable: ASan checks the bytes exist */
	kiln_tensor_free(t);
}
END_TEST

START_TEST(tensor_new_zero_dim_makes_empty_tensor)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F64, 2, (int64_t[]){0, 5});
	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(t->data);
	ck_assert_int_eq(kiln_tensor_numel(t), 0);
	ck_assert_uint_eq(kiln_tensor_nbytes(t), 0);
	kiln_tensor_free(t);
	/* a zero anywhere makes the product 0, whatever the other dims */
	t = kiln_tensor_new(KILN_U8, 3, (int64_t[]){INT64_MAX, 0, INT64_MAX});
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(kiln_tensor_numel(t), 0);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(tensor_new_rejects_bad_rank_dtype_and_dims)
{
	int64_t dims[KILN_MAX_RANK + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
	ck_assert_ptr_null(kiln_tensor_new(KILN_F32, -1, dims));
	ck_assert_ptr_null(kiln_tensor_new(KILN_F32, KILN_MAX_RANK + 1, dims));
	ck_assert_ptr_null(kiln_tensor_new(KILN_F32, 2, NULL));
	ck_assert_ptr_null(kiln_tensor_new(KILN_DT_INVALID, 1, dims));
	ck_assert_ptr_null(kiln_tensor_new(KILN_DT_COUNT, 1, dims));
	ck_assert_ptr_null(kiln_tensor_new(KILN_F32, 2, (int64_t[]){3, -1}));
	ck_assert_ptr_null(kiln_tensor_new(KILN_F32, 2, (int64_t[]){0, -1}));
	kiln_tensor *t = kiln_tensor_new(KILN_F32, KILN_MAX_RANK, dims);
	ck_assert_ptr_nonnull(t);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(tensor_new_rejects_overflowing_shapes)
{
	/* element count overflows int64 / uint64 */
	ck_assert_ptr_null(kiln_tensor_new(KILN_U8, 2, (int64_t[]){INT64_MAX, 2}));
	ck_assert_ptr_null(kiln_tensor_new(KILN_U8, 2, (int64_t[]){1LL << 32, 1LL << 32}));
	ck_assert_ptr_null(kiln_tensor_new(KILN_U8, 3, (int64_t[]){1LL << 21, 1LL << 21,
	                                                           1LL << 22}));
	/* count fits but bytes do not */
	ck_assert_ptr_null(kiln_tensor_new(KILN_F64, 1, (int64_t[]){1LL << 61}));
	ck_assert_ptr_null(kiln_tensor_new(KILN_F32, 2, (int64_t[]){1LL << 31, 1LL << 31}));
	/* bytes fit in size_t but not in one object */
	ck_assert_ptr_null(kiln_tensor_new(KILN_U8, 1, (int64_t[]){INT64_MAX}));
}
END_TEST

START_TEST(tensor_clone_copies_shape_and_data)
{
	kiln_tensor *t = patterned(KILN_I32, 3, (int64_t[]){2, 3, 4});
	kiln_tensor *c = kiln_tensor_clone(t);
	assert_same_tensor(t, c);
	ck_assert_ptr_ne(c->data, t->data);
	ck_assert_uint_eq((uintptr_t)c->data % 64, 0);
	kiln_tensor_free(t);
	kiln_tensor_free(c);
	ck_assert_ptr_null(kiln_tensor_clone(NULL));
}
END_TEST

START_TEST(tensor_clone_of_caller_built_tensor)
{
	double vals[2] = {1.5, -2.0};
	kiln_tensor mine = {.dtype = KILN_F64, .rank = 1, .shape = {2}, .data = vals};
	kiln_tensor *c = kiln_tensor_clone(&mine);
	assert_same_tensor(&mine, c);
	kiln_tensor_free(c);
	mine.data = NULL; /* no data to copy: refused, not a crash */
	ck_assert_ptr_null(kiln_tensor_clone(&mine));
}
END_TEST

START_TEST(tensor_functions_accept_null)
{
	kiln_tensor_free(NULL);
	ck_assert_int_eq(kiln_tensor_numel(NULL), -1);
	ck_assert_uint_eq(kiln_tensor_nbytes(NULL), 0);
	kiln_tensor bad = {.dtype = KILN_F32, .rank = 1, .shape = {-4}};
	ck_assert_int_eq(kiln_tensor_numel(&bad), -1);
	ck_assert_uint_eq(kiln_tensor_nbytes(&bad), 0);
}
END_TEST

/* ---- tensor sets ------------------------------------------------------- */

START_TEST(set_add_copies_the_tensor)
{
	kiln_tensor_set *s = kiln_tensor_set_new();
	kiln_tensor *t = patterned(KILN_F32, 1, (int64_t[]){4});
	ck_assert_int_eq(kiln_tensor_set_add(s, "w", t), KILN_OK);
	((float *)t->data)[0] = 99.0f;
	const kiln_tensor *got = kiln_tensor_set_get(s, "w");
	ck_assert_ptr_nonnull(got);
	ck_assert_ptr_ne(got, t);
	ck_assert(((float *)got->data)[0] != 99.0f);
	ck_assert_int_eq(s->count, 1);
	ck_assert_str_eq(s->items[0].name, "w");
	kiln_tensor_free(t);
	kiln_tensor_set_free(s);
}
END_TEST

START_TEST(set_add_replaces_same_name)
{
	kiln_tensor_set *s = kiln_tensor_set_new();
	kiln_tensor *a = patterned(KILN_F32, 1, (int64_t[]){4});
	kiln_tensor *b = patterned(KILN_I64, 2, (int64_t[]){2, 2});
	ck_assert_int_eq(kiln_tensor_set_add(s, "x", a), KILN_OK);
	ck_assert_int_eq(kiln_tensor_set_add(s, "y", a), KILN_OK);
	ck_assert_int_eq(kiln_tensor_set_add(s, "x", b), KILN_OK);
	ck_assert_int_eq(s->count, 2);
	assert_same_tensor(kiln_tensor_set_get(s, "x"), b);
	assert_same_tensor(kiln_tensor_set_get(s, "y"), a);
	/* replacing a tensor with itself must not read freed memory */
	ck_assert_int_eq(kiln_tensor_set_add(s, "x", kiln_tensor_set_get(s, "x")), KILN_OK);
	assert_same_tensor(kiln_tensor_set_get(s, "x"), b);
	kiln_tensor_free(a);
	kiln_tensor_free(b);
	kiln_tensor_set_free(s);
}
END_TEST

START_TEST(set_get_missing_name_is_null)
{
	kiln_tensor_set *s = kiln_tensor_set_new();
	ck_assert_ptr_null(kiln_tensor_set_get(s, "nope"));
	ck_assert_ptr_null(kiln_tensor_set_get(s, NULL));
	ck_assert_ptr_null(kiln_tensor_set_get(NULL, "x"));
	kiln_tensor_set_free(s);
	kiln_tensor_set_free(NULL);
}
END_TEST

START_TEST(set_add_rejects_bad_arguments)
{
	kiln_tensor_set *s = kiln_tensor_set_new();
	kiln_tensor *t = patterned(KILN_U8, 1, (int64_t[]){3});
	ck_assert_int_eq(kiln_tensor_set_add(NULL, "a", t), KILN_EINVAL);
	ck_assert_int_eq(kiln_tensor_set_add(s, NULL, t), KILN_EINVAL);
	ck_assert_int_eq(kiln_tensor_set_add(s, "a", NULL), KILN_EINVAL);
	kiln_tensor bad = {.dtype = KILN_F32, .rank = KILN_MAX_RANK + 1};
	ck_assert_int_eq(kiln_tensor_set_add(s, "a", &bad), KILN_EINVAL);
	ck_assert_int_eq(s->count, 0);
	kiln_tensor_free(t);
	kiln_tensor_set_free(s);
}
END_TEST

/* ---- npy: round trips -------------------------------------------------- */

static const struct {
	int rank;
	int64_t shape[4];
} rt_shapes[] = {{0, {0}}, {1, {5}}, {2, {2, 3}}, {4, {2, 1, 3, 2}}, {2, {0, 4}}};

START_TEST(npy_roundtrip_every_dtype)
{
	kiln_error err;
	for (int dt = KILN_F32; dt < KILN_DT_COUNT; dt++) {
		for (size_t i = 0; i < sizeof rt_shapes / sizeof rt_shapes[0]; i++) {
			kiln_tensor *t = patterned((kiln_dtype)dt, rt_shapes[i].rank, rt_shapes[i].shape);
			kiln_tensor *back = NULL;
			const char *p = tpath("t.npy");
			ck_assert_int_eq(kiln_npy_write(p, t, &err), KILN_OK);
			ck_assert_msg(kiln_npy_read(p, &back, &err) == KILN_OK, "%s", err.msg);
			assert_same_tensor(t, back);
			kiln_tensor_free(t);
			kiln_tensor_free(back);
		}
	}
	ck_assert_int_eq(count_entries(tmpdir), 1); /* no temporaries left */
}
END_TEST

START_TEST(npy_write_pads_header_like_numpy)
{
	kiln_error err;
	kiln_tensor *t = patterned(KILN_F32, 2, (int64_t[]){2, 3});
	const char *p = tpath("h.npy");
	ck_assert_int_eq(kiln_npy_write(p, t, &err), KILN_OK);
	size_t n;
	unsigned char *b = slurp(p, &n);
	size_t hdr = n - 24;
	ck_assert_uint_eq(hdr % 64, 0);
	ck_assert(memcmp(b, "\x93NUMPY\x01\x00", 8) == 0);
	ck_assert_uint_eq(b[8] | b[9] << 8, hdr - 10);
	ck_assert_int_eq(b[hdr - 1], '\n');
	const char *want = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
	ck_assert(memcmp(b + 10, want, strlen(want)) == 0);
	free(b);
	kiln_tensor_free(t);
}
END_TEST

/* bf16 has no NumPy dtype; kiln writes it as two opaque bytes, '|V2'. */
START_TEST(npy_writes_bf16_as_void2_and_1d_shape_as_1_tuple)
{
	kiln_error err;
	kiln_tensor *t = patterned(KILN_BF16, 1, (int64_t[]){3});
	const char *p = tpath("bf.npy");
	ck_assert_int_eq(kiln_npy_write(p, t, &err), KILN_OK);
	size_t n;
	char *b = (char *)slurp(p, &n);
	ck_assert_ptr_nonnull(memmem(b, n, "'descr': '|V2'", 14));
	ck_assert_ptr_nonnull(memmem(b, n, "'shape': (3,)", 13));
	free(b);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_write_rejects_bad_arguments)
{
	kiln_error err;
	kiln_tensor *t = patterned(KILN_U8, 1, (int64_t[]){3});
	ck_assert_int_eq(kiln_npy_write(NULL, t, &err), KILN_EINVAL);
	ck_assert_int_eq(kiln_npy_write(tpath("a.npy"), NULL, NULL), KILN_EINVAL);
	kiln_tensor bad = {.dtype = KILN_F32, .rank = 1, .shape = {-2}};
	EXPECT_ERR(kiln_npy_write(tpath("a.npy"), &bad, &err), err, KILN_EINVAL, "a.npy",
	           "malformed tensor");
	ck_assert_int_eq(count_entries(tmpdir), 0);
	kiln_tensor_free(t);
}
END_TEST

/* ---- npy: files NumPy wrote -------------------------------------------- */

static kiln_tensor *read_fixture(const char *name, kiln_dtype dt, int rank)
{
	kiln_error err;
	kiln_tensor *t = NULL;
	ck_assert_msg(kiln_npy_read(fixture(name), &t, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(t->dtype, dt);
	ck_assert_int_eq(t->rank, rank);
	return t;
}

START_TEST(npy_reads_numpy_f32_and_i32)
{
	kiln_tensor *t = read_fixture("npy/f32_2x3.npy", KILN_F32, 2);
	ck_assert_int_eq(t->shape[0], 2);
	ck_assert_int_eq(t->shape[1], 3);
	for (int i = 0; i < 6; i++)
		ck_assert(((float *)t->data)[i] == i * 0.5f);
	kiln_tensor_free(t);
	t = read_fixture("npy/i32_2x2.npy", KILN_I32, 2);
	static const int32_t want[] = {1, -2, 3, -4};
	ck_assert(memcmp(t->data, want, sizeof want) == 0);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_reads_numpy_rank0_i64)
{
	kiln_tensor *t = read_fixture("npy/i64_scalar.npy", KILN_I64, 0);
	ck_assert_int_eq(*(int64_t *)t->data, -7);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_reads_numpy_small_types)
{
	kiln_tensor *t = read_fixture("npy/bool_5.npy", KILN_BOOL, 1);
	ck_assert(memcmp(t->data, "\1\0\1\1\0", 5) == 0);
	kiln_tensor_free(t);
	t = read_fixture("npy/i8_4.npy", KILN_I8, 1);
	ck_assert(memcmp(t->data, (int8_t[]){-128, -1, 0, 127}, 4) == 0);
	kiln_tensor_free(t);
	t = read_fixture("npy/f16_3.npy", KILN_F16, 1); /* 1.0, -2.5, 65504 */
	ck_assert(memcmp(t->data, (uint16_t[]){0x3c00, 0xc100, 0x7bff}, 6) == 0);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_reads_numpy_fortran_order_as_row_major)
{
	kiln_tensor *t = read_fixture("npy/f64_fortran_2x3.npy", KILN_F64, 2);
	ck_assert_int_eq(t->shape[0], 2);
	ck_assert_int_eq(t->shape[1], 3);
	for (int i = 0; i < 6; i++)
		ck_assert(((double *)t->data)[i] == i);
	kiln_tensor_free(t);
	t = read_fixture("npy/f32_fortran_2x3x4.npy", KILN_F32, 3);
	ck_assert_int_eq(t->shape[2], 4);
	for (int i = 0; i < 24; i++)
		ck_assert(((float *)t->data)[i] == i);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_reads_numpy_version_2_header)
{
	kiln_tensor *t = read_fixture("npy/u8_v2.npy", KILN_U8, 2);
	ck_assert(memcmp(t->data, "\0\1\2\3", 4) == 0);
	kiln_tensor_free(t);
}
END_TEST

/* ---- npy: malformed files ---------------------------------------------- */

#define LEN_AUTO UINT32_MAX

/* Writes an npy file: magic, version major.0, a header length (dict's own
 * unless hlen says otherwise), the dict text, then ndata bytes. */
static const char *make_npy(const char *name, int major, const char *dict, uint32_t hlen,
                            const void *data, size_t ndata)
{
	const char *path = tpath(name);
	size_t dlen = strlen(dict), pre = major == 1 ? 10 : 12;
	uint32_t len = hlen == LEN_AUTO ? (uint32_t)dlen : hlen;
	unsigned char *b = calloc(1, pre + dlen + ndata);
	memcpy(b, "\x93NUMPY", 6);
	b[6] = (unsigned char)major;
	for (size_t i = 0; i < pre - 8; i++)
		b[8 + i] = (unsigned char)(len >> (8 * i));
	memcpy(b + pre, dict, dlen);
	if (data)
		memcpy(b + pre + dlen, data, ndata);
	write_file(path, b, pre + dlen + ndata);
	free(b);
	return path;
}

static const char *npy_dict(const char *descr, const char *fortran, const char *shape)
{
	static char buf[512];
	snprintf(buf, sizeof buf, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }\n",
	         descr, fortran, shape);
	return buf;
}

/* Reads path expecting failure; leaves *out NULL. */
static kiln_status npy_fail(const char *path, kiln_error *err)
{
	kiln_tensor *t = (kiln_tensor *)1;
	kiln_status st = kiln_npy_read(path, &t, err);
	ck_assert_ptr_null(t);
	return st;
}

START_TEST(npy_accepts_hand_made_valid_file)
{
	kiln_error err;
	kiln_tensor *t = NULL;
	const char *p = make_npy("ok.npy", 1, npy_dict("<f4", "False", "(2,)"), LEN_AUTO,
	                         "\0\0\x80\x3f\0\0\0\x40", 8);
	ck_assert_msg(kiln_npy_read(p, &t, &err) == KILN_OK, "%s", err.msg);
	ck_assert(((float *)t->data)[0] == 1.0f && ((float *)t->data)[1] == 2.0f);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_rejects_bad_magic)
{
	kiln_error err;
	const char *p = tpath("magic.npy");
	write_file(p, "\x93NUMPX\x01\x00\x04\x00{}  ", 14);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "bad magic");
}
END_TEST

START_TEST(npy_rejects_truncated_preamble)
{
	kiln_error err;
	const char *p = tpath("short.npy");
	write_file(p, "\x93NUMPY\x01", 7);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "too short");
	write_file(p, "", 0);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "too short");
	write_file(p, "\x93NUMPY\x02\x00\x10\x00", 10); /* v2 needs 4 length bytes */
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "preamble truncated");
}
END_TEST

START_TEST(npy_rejects_truncated_header)
{
	kiln_error err;
	/* the length is right, but the file stops half way through the dict */
	const char *dict = npy_dict("<f4", "False", "(2,)");
	const char *p = make_npy("trunc.npy", 1, dict, LEN_AUTO, NULL, 0);
	ck_assert_int_eq(truncate(p, 10 + 20), 0);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "runs past the end of the file");
}
END_TEST

START_TEST(npy_rejects_header_len_beyond_file)
{
	kiln_error err;
	const char *p = make_npy("hlen.npy", 2, npy_dict("<f4", "False", "()"), 0xfffffff0u,
	                         "\0\0\0\0", 4);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "header length 4294967280");
}
END_TEST

START_TEST(npy_rejects_bad_dict_syntax)
{
	kiln_error err;
	static const struct {
		const char *dict, *msg;
	} cases[] = {
		{"{'descr': '<f4' 'fortran_order': False, 'shape': (1,), }", "expected ',' or '}'"},
		{"'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "expected '{'"},
		{"{'descr' '<f4', 'fortran_order': False, 'shape': (1,), }", "expected ':'"},
		{"{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }", "expected ',' or '}'"},
		{"{'descr': '<f4     ", "unterminated string"},
		{"{'descr': '<f4                                         ", "string too long"},
		{"{descr: '<f4', 'fortran_order': False, 'shape': (1,), }", "quoted string"},
		{"{'descr': '<f4', 'fortran_order': false, 'shape': (1,), }", "True or False"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': [1], }", "must be a tuple"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (1), }", "must be a tuple"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (1,,), }", "expected a dim"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2), }", "expected ',' or ')'"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x", "junk after"},
		{"{'descr': '<f4', 'descr': '<f4', 'shape': (1,), }", "duplicate key"},
		{"{'descr': '<f4', 'shape': (1,), }", "missing key"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "unknown key"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", "expected ',' or '}'"},
		{"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,), }", "unsupported char"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *p = make_npy("dict.npy", 1, cases[i].dict, LEN_AUTO, "\0\0\0\0", 4);
		EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, cases[i].msg);
		ck_assert_ptr_nonnull(strstr(err.msg, "npy header, offset"));
	}
}
END_TEST

START_TEST(npy_rejects_data_size_mismatch)
{
	kiln_error err;
	char data[32] = {0};
	const char *p = make_npy("short.npy", 1, npy_dict("<f4", "False", "(2, 3)"), LEN_AUTO,
	                         data, 20);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p,
	           "data is 20 bytes but shape and dtype '<f4' need 24");
	p = make_npy("long.npy", 1, npy_dict("<f4", "False", "(2, 3)"), LEN_AUTO, data, 28);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "data is 28 bytes");
}
END_TEST

START_TEST(npy_rejects_dims_that_overflow)
{
	kiln_error err;
	const char *p = make_npy("big.npy", 1, npy_dict("<f8", "False",
	                         "(4294967296, 4294967296, 4294967296)"), LEN_AUTO, NULL, 0);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "shape is too large");
	p = make_npy("big2.npy", 1, npy_dict("<f8", "False", "(99999999999999999999,)"),
	             LEN_AUTO, NULL, 0);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "dimension too large");
	/* a shape that fits but claims far more data than the file has */
	p = make_npy("big3.npy", 1, npy_dict("<f8", "False", "(1000000000000,)"), LEN_AUTO,
	             NULL, 0);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "data is 0 bytes");
	p = make_npy("neg.npy", 1, npy_dict("<f8", "False", "(-1, 2)"), LEN_AUTO, NULL, 0);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EPARSE, p, "negative dimension");
}
END_TEST

START_TEST(npy_rejects_rank_above_max)
{
	kiln_error err;
	const char *p = make_npy("r9.npy", 1, npy_dict("|u1", "False",
	                         "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), LEN_AUTO, "\0", 1);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EUNSUPPORTED, p, "KILN_MAX_RANK");
}
END_TEST

START_TEST(npy_rejects_big_endian_and_unknown_dtypes)
{
	kiln_error err;
	const char *p = make_npy("be.npy", 1, npy_dict(">f4", "False", "(1,)"), LEN_AUTO,
	                         "\0\0\0\0", 4);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EUNSUPPORTED, p, "big-endian");
	p = make_npy("c8.npy", 1, npy_dict("<c8", "False", "(1,)"), LEN_AUTO, NULL, 8);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EUNSUPPORTED, p, "dtype '<c8' is not supported");
	p = make_npy("pipe.npy", 1, npy_dict("|f4", "False", "(1,)"), LEN_AUTO, NULL, 4);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EUNSUPPORTED, p, "dtype '|f4'");
	p = make_npy("st.npy", 1, "{'descr': [('a', '<f4')], 'fortran_order': False, "
	             "'shape': (1,), }", LEN_AUTO, NULL, 4);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EUNSUPPORTED, p, "structured");
	/* one-byte types have no byte order, so any mark is fine */
	kiln_tensor *t = NULL;
	p = make_npy("u1.npy", 1, npy_dict(">u1", "False", "(1,)"), LEN_AUTO, "\7", 1);
	ck_assert_int_eq(kiln_npy_read(p, &t, &err), KILN_OK);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_reads_void2_as_bf16)
{
	kiln_error err;
	kiln_tensor *t = NULL;
	const char *p = make_npy("v2.npy", 1, npy_dict("<V2", "False", "(1,)"), LEN_AUTO,
	                         "\x80\x3f", 2);
	ck_assert_int_eq(kiln_npy_read(p, &t, &err), KILN_OK);
	ck_assert_int_eq(t->dtype, KILN_BF16);
	ck_assert_uint_eq(*(uint16_t *)t->data, 0x3f80);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_rejects_unknown_version)
{
	kiln_error err;
	const char *p = make_npy("v9.npy", 9, npy_dict("<f4", "False", "()"), LEN_AUTO,
	                         "\0\0\0\0", 4);
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EUNSUPPORTED, p, "version 9.0");
}
END_TEST

START_TEST(npy_reads_nonzero_bool_bytes_as_true)
{
	kiln_error err;
	kiln_tensor *t = NULL;
	const char *p = make_npy("b.npy", 1, npy_dict("|b1", "False", "(4,)"), LEN_AUTO,
	                         "\0\1\2\xff", 4);
	ck_assert_int_eq(kiln_npy_read(p, &t, &err), KILN_OK);
	ck_assert(memcmp(t->data, "\0\1\1\1", 4) == 0);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(npy_missing_file_or_directory_is_eio)
{
	kiln_error err;
	const char *p = tpath("absent.npy");
	EXPECT_ERR(npy_fail(p, &err), err, KILN_EIO, p, "cannot open");
	EXPECT_ERR(npy_fail(tmpdir, &err), err, KILN_EIO, tmpdir, "not a regular file");
	ck_assert_int_eq(kiln_npy_read(p, NULL, &err), KILN_EINVAL);
	ck_assert_int_eq(npy_fail(p, NULL), KILN_EIO); /* err may be NULL */
}
END_TEST

static void fifo_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "a reader blocked on a FIFO\n";
	ssize_t r = write(2, msg, sizeof msg - 1);
	(void)r;
	_exit(3);
}

/* Every reader refuses a FIFO at once instead of waiting for a writer
 * (the alarm fails the test rather than let it hang): .npy, safetensors,
 * .kir, a .kir's weights file and a model library. */
START_TEST(readers_refuse_a_fifo_without_blocking)
{
	signal(SIGALRM, fifo_alarm);
	alarm(10);
	kiln_error err = {0};
	kiln_tensor *t = NULL;
	kiln_tensor_set *s = NULL;
	kiln_graph *g = NULL;
	kiln_model *m = NULL;
	const char *names[] = {"a.npy", "a.safetensors", "a.kir", "a.so"};
	for (int i = 0; i < 4; i++) {
		const char *p = tpath(names[i]);
		ck_assert_int_eq(mkfifo(p, 0644), 0);
		kiln_status st = i == 0 ? kiln_npy_read(p, &t, &err)
		                 : i == 1 ? kiln_safetensors_read(p, &s, &err)
		                 : i == 2 ? kiln_graph_load(p, &g, &err)
		                          : kiln_load(p, &m, &err);
		ck_assert_int_eq(st, KILN_EIO);
		ck_assert_msg(strstr(err.msg, p) && strstr(err.msg, "not a regular file (a FIFO)"),
		              "%s: %s", names[i], err.msg);
	}
	/* a .kir whose weights file is a FIFO */
	const char *kir = tpath("b.kir");
	FILE *f = fopen(kir, "w");
	ck_assert_ptr_nonnull(f);
	fputs("graph @b(%x: f32[2]) -> (%y: f32[2]) {\n  param %w: f32[2]\n"
	      "  %y = add %x, %w : f32[2]\n  ret %y\n}\n", f);
	fclose(f);
	ck_assert_int_eq(mkfifo(tpath("b.safetensors"), 0644), 0);
	ck_assert_int_eq(kiln_graph_load(kir, &g, &err), KILN_EIO);
	ck_assert_msg(strstr(err.msg, "b.safetensors") && strstr(err.msg, "FIFO"), "%s", err.msg);
	ck_assert_ptr_null(t);
	ck_assert_ptr_null(s);
	ck_assert_ptr_null(g);
	ck_assert_ptr_null(m);
	alarm(0);
	signal(SIGALRM, SIG_DFL);
}
END_TEST

/* ---- safetensors: round trips and the library's layout ------------------ */

static kiln_tensor_set *sample_set(void)
{
	kiln_tensor_set *s = kiln_tensor_set_new();
	static const struct {
		const char *name;
		kiln_dtype dt;
		int rank;
		int64_t shape[3];
	} items[] = {
		{"fc1.weight", KILN_F32, 2, {3, 4}}, {"fc1.bias", KILN_F32, 1, {3}},
		{"steps", KILN_I64, 0, {0}},          {"emb", KILN_BF16, 2, {3, 3}},
		{"mask", KILN_BOOL, 1, {5}},          {"none", KILN_U8, 1, {0}},
		{"d", KILN_F64, 3, {1, 1, 2}},        {"h", KILN_F16, 1, {3}},
		{"q", KILN_I8, 1, {7}},               {"i", KILN_I32, 2, {2, 1}},
		{"odd \"name\"\\\n\t\x01 caf\xc3\xa9", KILN_U8, 1, {2}},
	};
	for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
		kiln_tensor *t = patterned(items[i].dt, items[i].rank, items[i].shape);
		ck_assert_int_eq(kiln_tensor_set_add(s, items[i].name, t), KILN_OK);
		kiln_tensor_free(t);
	}
	return s;
}

START_TEST(st_roundtrip_several_named_tensors)
{
	kiln_error err;
	kiln_tensor_set *s = sample_set(), *back = NULL;
	const char *p = tpath("m.safetensors");
	ck_assert_int_eq(kiln_safetensors_write(p, s, &err), KILN_OK);
	ck_assert_msg(kiln_safetensors_read(p, &back, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(back->count, s->count);
	for (int i = 0; i < s->count; i++)
		assert_same_tensor(kiln_tensor_set_get(back, s->items[i].name), s->items[i].tensor);
	kiln_tensor_set_free(s);
	kiln_tensor_set_free(back);
	ck_assert_int_eq(count_entries(tmpdir), 1);
}
END_TEST

/* The golden bytes of the Rust library's test_serialization and
 * test_serialization_forced_alignement. */
START_TEST(st_write_matches_rust_library_bytes)
{
	static const struct {
		const char *name, *json;
		int rank;
		int64_t shape[4];
	} cases[] = {
		{"attn.0", "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],"
		           "\"data_offsets\":[0,24]}}", 3, {1, 2, 3}},
		{"attn0", "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],"
		          "\"data_offsets\":[0,24]}}       ", 4, {1, 1, 2, 3}},
	};
	kiln_error err;
	for (int c = 0; c < 2; c++) {
		kiln_tensor *t = kiln_tensor_new(KILN_F32, cases[c].rank, cases[c].shape);
		for (int i = 0; i < 6; i++)
			((float *)t->data)[i] = (float)i;
		kiln_tensor_set *s = kiln_tensor_set_new();
		kiln_tensor_set_add(s, cases[c].name, t);
		const char *p = tpath("g.safetensors");
		ck_assert_int_eq(kiln_safetensors_write(p, s, &err), KILN_OK);
		size_t n, jl = strlen(cases[c].json);
		unsigned char *b = slurp(p, &n);
		ck_assert_uint_eq(n, 8 + jl + 24);
		ck_assert_uint_eq(b[0], jl);
		ck_assert(memcmp(b + 1, "\0\0\0\0\0\0\0", 7) == 0);
		ck_assert(memcmp(b + 8, cases[c].json, jl) == 0);
		ck_assert(memcmp(b + 8 + jl, t->data, 24) == 0);
		free(b);
		kiln_tensor_free(t);
		kiln_tensor_set_free(s);
	}
}
END_TEST

START_TEST(st_write_empty_set_matches_rust_library_bytes)
{
	kiln_error err;
	kiln_tensor_set *s = kiln_tensor_set_new(), *back = NULL;
	const char *p = tpath("e.safetensors");
	ck_assert_int_eq(kiln_safetensors_write(p, s, &err), KILN_OK);
	size_t n;
	unsigned char *b = slurp(p, &n);
	ck_assert_uint_eq(n, 16);
	ck_assert(memcmp(b, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
	free(b);
	ck_assert_int_eq(kiln_safetensors_read(p, &back, &err), KILN_OK);
	ck_assert_int_eq(back->count, 0);
	kiln_tensor_set_free(back);
	kiln_tensor_set_free(s);
}
END_TEST

/* Descending alignment, then name: every tensor lands aligned to its type. */
START_TEST(st_write_orders_by_dtype_then_name)
{
	kiln_error err;
	kiln_tensor_set *s = kiln_tensor_set_new();
	kiln_tensor *u = patterned(KILN_U8, 1, (int64_t[]){3});
	kiln_tensor *f = patterned(KILN_F32, 1, (int64_t[]){1});
	kiln_tensor *l = patterned(KILN_I64, 1, (int64_t[]){1});
	kiln_tensor_set_add(s, "a", u);
	kiln_tensor_set_add(s, "c", f);
	kiln_tensor_set_add(s, "b", f);
	kiln_tensor_set_add(s, "z", l);
	const char *p = tpath("o.safetensors");
	ck_assert_int_eq(kiln_safetensors_write(p, s, &err), KILN_OK);
	size_t n;
	char *b = (char *)slurp(p, &n);
	const char *want = "{\"z\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
	                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
	                   "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]},"
	                   "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}";
	ck_assert(memcmp(b + 8, want, strlen(want)) == 0);
	ck_assert_uint_eq((unsigned char)b[0] % 8, 0);
	free(b);
	kiln_tensor_free(u);
	kiln_tensor_free(f);
	kiln_tensor_free(l);
	kiln_tensor_set_free(s);
}
END_TEST

START_TEST(st_write_rejects_unwritable_sets)
{
	kiln_error err;
	float v = 1;
	kiln_named_tensor items[2] = {
		{"w", &(kiln_tensor){.dtype = KILN_F32, .rank = 0, .data = &v}},
		{"w", &(kiln_tensor){.dtype = KILN_F32, .rank = 0, .data = &v}},
	};
	kiln_tensor_set dup = {2, items};
	const char *p = tpath("bad.safetensors");
	EXPECT_ERR(kiln_safetensors_write(p, &dup, &err), err, KILN_EINVAL, p,
	           "duplicate tensor name 'w'");
	items[1].name = "bad\xff";
	EXPECT_ERR(kiln_safetensors_write(p, &dup, &err), err, KILN_EINVAL, p, "not UTF-8");
	items[1].name = "__metadata__";
	EXPECT_ERR(kiln_safetensors_write(p, &dup, &err), err, KILN_EINVAL, p, "reserved");
	items[1].name = "x";
	items[1].tensor->rank = -1;
	EXPECT_ERR(kiln_safetensors_write(p, &dup, &err), err, KILN_EINVAL, p, "'x' is malformed");
	ck_assert_int_eq(kiln_safetensors_write(NULL, &dup, &err), KILN_EINVAL);
	ck_assert_int_eq(kiln_safetensors_write(p, NULL, &err), KILN_EINVAL);
	ck_assert_int_eq(count_entries(tmpdir), 0);
}
END_TEST

/* ---- safetensors: the PyTorch fixture ---------------------------------- */

static void check_torch_tensor(const kiln_tensor_set *s, const char *name, kiln_dtype dt,
                               int rank, const int64_t *shape, const void *data, size_t n)
{
	const kiln_tensor *t = kiln_tensor_set_get(s, name);
	ck_assert_msg(t != NULL, "no tensor '%s'", name);
	ck_assert_int_eq(t->dtype, dt);
	ck_assert_int_eq(t->rank, rank);
	for (int i = 0; i < rank; i++)
		ck_assert_int_eq(t->shape[i], shape[i]);
	ck_assert_uint_eq(kiln_tensor_nbytes(t), n);
	ck_assert_msg(memcmp(t->data, data, n) == 0, "data of '%s' differs", name);
}

START_TEST(st_reads_file_of_torch_tensors)
{
	kiln_error err;
	kiln_tensor_set *s = NULL;
	ck_assert_msg(kiln_safetensors_read(fixture("st/torch_small.safetensors"), &s, &err) ==
	              KILN_OK, "%s", err.msg);
	ck_assert_int_eq(s->count, 12);
	float w[12];
	for (int i = 0; i < 12; i++)
		w[i] = i / 4.0f;
	check_torch_tensor(s, "fc1.weight", KILN_F32, 2, (int64_t[]){3, 4}, w, sizeof w);
	check_torch_tensor(s, "fc1.bias", KILN_F32, 1, (int64_t[]){3},
	                   (float[]){0.5f, -1.0f, 2.0f}, 12);
	check_torch_tensor(s, "emb.weight", KILN_BF16, 2, (int64_t[]){2, 2},
	                   (uint16_t[]){0x3f80, 0xc000, 0x3f00, 0x4040}, 8);
	check_torch_tensor(s, "bn.num_batches_tracked", KILN_I64, 0, NULL, (int64_t[]){42}, 8);
	check_torch_tensor(s, "mask", KILN_BOOL, 1, (int64_t[]){3}, "\1\0\1", 3);
	check_torch_tensor(s, "half", KILN_F16, 1, (int64_t[]){2},
	                   (uint16_t[]){0x3e00, 0xb400}, 4);
	check_torch_tensor(s, "q", KILN_I8, 1, (int64_t[]){3}, (int8_t[]){-128, 0, 127}, 3);
	check_torch_tensor(s, "pix", KILN_U8, 1, (int64_t[]){2}, "\0\xff", 2);
	check_torch_tensor(s, "idx", KILN_I32, 1, (int64_t[]){3}, (int32_t[]){1, -2, 3}, 12);
	check_torch_tensor(s, "dbl", KILN_F64, 1, (int64_t[]){1}, (double[]){3.25}, 8);
	check_torch_tensor(s, "empty", KILN_F32, 2, (int64_t[]){0, 3}, "", 0);
	/* written as caf\u00e9.\ud83d\ude00 */
	check_torch_tensor(s, "caf\xc3\xa9.\xf0\x9f\x98\x80", KILN_F32, 1, (int64_t[]){1},
	                   (float[]){7.0f}, 4);
	kiln_tensor_set_free(s);
}
END_TEST

/* Rewriting what PyTorch saved gives the bytes the Rust library would write. */
START_TEST(st_rewrite_of_torch_file_is_byte_identical)
{
	kiln_error err;
	kiln_tensor_set *s = NULL;
	ck_assert_int_eq(kiln_safetensors_read(fixture("st/torch_small.safetensors"), &s, &err),
	                 KILN_OK);
	const char *p = tpath("re.safetensors");
	ck_assert_int_eq(kiln_safetensors_write(p, s, &err), KILN_OK);
	size_t n1, n2;
	unsigned char *mine = slurp(p, &n1);
	unsigned char *lib = slurp(fixture("st/torch_small_nometa.safetensors"), &n2);
	ck_assert_ptr_nonnull(lib);
	ck_assert_uint_eq(n1, n2);
	ck_assert(memcmp(mine, lib, n1) == 0);
	free(mine);
	free(lib);
	kiln_tensor_set_free(s);
}
END_TEST

/* ---- safetensors: malformed files -------------------------------------- */

#define HLEN_AUTO UINT64_MAX

/* Writes a safetensors file: length (json's own unless hlen says otherwise),
 * json, then ndata bytes counting up from 1. */
static const char *make_st(const char *name, const char *json, uint64_t hlen, size_t ndata)
{
	const char *path = tpath(name);
	size_t jl = strlen(json);
	uint64_t len = hlen == HLEN_AUTO ? jl : hlen;
	unsigned char *b = malloc(8 + jl + ndata);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(len >> (8 * i));
	memcpy(b + 8, json, jl);
	for (size_t i = 0; i < ndata; i++)
		b[8 + jl + i] = (unsigned char)(i + 1);
	write_file(path, b, 8 + jl + ndata);
	free(b);
	return path;
}

static kiln_status st_fail(const char *path, kiln_error *err)
{
	kiln_tensor_set *s = (kiln_tensor_set *)1;
	kiln_status st = kiln_safetensors_read(path, &s, err);
	ck_assert_ptr_null(s);
	return st;
}

#define W_F32x2 "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"

START_TEST(st_accepts_hand_made_valid_file)
{
	kiln_error err;
	kiln_tensor_set *s = NULL;
	/* whitespace, fields in another order, metadata last, a gap and tail */
	const char *p = make_st("ok.safetensors",
	                        " { \"w\" : { \"data_offsets\" : [ 4 , 12 ] , \"shape\":[2],"
	                        "\"dtype\":\"F32\"}, \"e\\\"\\/\\n\\u0041\":{\"dtype\":\"U8\","
	                        "\"shape\":[],\"data_offsets\":[12,13]},"
	                        "\"__metadata__\":{\"a\":\"b\",\"c\":\"\\u00e9\"}}\t\r\n ",
	                        HLEN_AUTO, 16);
	ck_assert_msg(kiln_safetensors_read(p, &s, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(s->count, 2);
	ck_assert(memcmp(kiln_tensor_set_get(s, "w")->data, "\5\6\7\10\11\12\13\14", 8) == 0);
	ck_assert_ptr_nonnull(kiln_tensor_set_get(s, "e\"/\nA"));
	kiln_tensor_set_free(s);
}
END_TEST

START_TEST(st_rejects_truncated_file)
{
	kiln_error err;
	const char *p = make_st("t.safetensors", "", HLEN_AUTO, 0);
	ck_assert_int_eq(truncate(p, 5), 0);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "too short");
	/* the header is whole, but the data it describes is cut off */
	p = make_st("t2.safetensors", W_F32x2, HLEN_AUTO, 4);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p,
	           "tensor 'w': data_offsets [0, 8] run past the data buffer (4 bytes)");
}
END_TEST

START_TEST(st_rejects_header_len_beyond_file_or_cap)
{
	kiln_error err;
	const char *p = make_st("h.safetensors", W_F32x2, 1000, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "header length 1000 runs past the end");
	p = make_st("h2.safetensors", W_F32x2, UINT64_MAX - 3, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "exceeds the 100000000-byte limit");
	p = make_st("h3.safetensors", W_F32x2, 100000001, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "limit");
}
END_TEST

START_TEST(st_rejects_bad_json)
{
	static const struct {
		const char *json, *msg;
	} cases[] = {
		{"{\"w\" {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "expected ':'"},
		{"[1,2]", "expected '{'"},
		{"", "expected '{', found the end of the header"},
		{"{\"w\":{\"dtype\":\"F32\"", "expected '}', found the end"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", "junk after"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", "expected a string"},
		{"{\"w\":{\"dtype\":F32,\"shape\":[2],\"data_offsets\":[0,8]}}", "expected a string"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", "fraction"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2e0],\"data_offsets\":[0,8]}}", "fraction"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", "leading zero"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,8]}}", "non-negative"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", "needs 2 numbers, not 3"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}}", "needs 2 numbers"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}",
		 "integer too large"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", "expected '}'"},
		{"{\"w\":{}}", "empty description"},
		{"{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", "tensor 'w': missing dtype"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", "tensor 'w': missing data_offsets"},
		{"{\"w\":{\"dtype\":\"F32\",\"foo\":1,\"shape\":[2],\"data_offsets\":[0,8]}}",
		 "unknown key 'foo'"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"shape\":[2],\"data_offsets\":[0,8]}}",
		 "duplicate key 'shape'"},
		{"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"__metadata__\":"
		 "{\"a\":1}}", "__metadata__ values must be strings"},
		{"{\"__metadata__\":{},\"__metadata__\":{}}", "duplicate __metadata__"},
		{"{\"w\\q\":{}}", "bad escape '\\q'"},
		{"{\"w\\u12G4\":{}}", "bad \\u escape"},
		{"{\"w\\ud800\":{}}", "high surrogate not followed by a low one"},
		{"{\"w\\udc00\":{}}", "lone low surrogate"},
		{"{\"w\\u0000\":{}}", "NUL character"},
		{"{\"w\xff\":{}}", "invalid UTF-8"},
		{"{\"w\xc0\x80\":{}}", "invalid UTF-8"},       /* overlong NUL */
		{"{\"w\xed\xa0\x80\":{}}", "invalid UTF-8"},   /* encoded surrogate */
		{"{\"w\n\":{}}", "control character"},
		{"{\"w", "unterminated string"},
		{"{\"w\\", "unterminated string"},
	};
	kiln_error err;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *p = make_st("j.safetensors", cases[i].json, HLEN_AUTO, 8);
		EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, cases[i].msg);
	}
	/* the message says where in the header the problem is */
	const char *p = make_st("j.safetensors", cases[0].json, HLEN_AUTO, 8);
	st_fail(p, &err);
	ck_assert_ptr_nonnull(strstr(err.msg, "safetensors header, byte 5: expected ':'"));
}
END_TEST

START_TEST(st_rejects_offsets_out_of_range_or_reversed)
{
	kiln_error err;
	const char *p = make_st("o.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
	                        "\"data_offsets\":[8,16]}}", HLEN_AUTO, 12);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p,
	           "tensor 'w': data_offsets [8, 16] run past the data buffer (12 bytes)");
	p = make_st("o2.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
	            "\"data_offsets\":[8,0]}}", HLEN_AUTO, 12);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "'w': data_offsets [8, 0] are reversed");
	p = make_st("o3.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
	            "\"data_offsets\":[18446744073709551615,18446744073709551615]}}", HLEN_AUTO, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "run past the data buffer");
}
END_TEST

START_TEST(st_rejects_size_mismatch)
{
	kiln_error err;
	const char *p = make_st("s.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],"
	                        "\"data_offsets\":[0,8]}}", HLEN_AUTO, 16);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p,
	           "tensor 'w': data_offsets [0, 8] hold 8 bytes but its F32 shape needs 16");
	p = make_st("s2.safetensors", "{\"w\":{\"dtype\":\"I8\",\"shape\":[4294967296,4294967296,"
	            "4294967296],\"data_offsets\":[0,0]}}", HLEN_AUTO, 0);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "tensor 'w': shape is too large");
}
END_TEST

START_TEST(st_rejects_unknown_and_unsupported_dtypes)
{
	kiln_error err;
	const char *p = make_st("d.safetensors", "{\"w\":{\"dtype\":\"F33\",\"shape\":[2],"
	                        "\"data_offsets\":[0,8]}}", HLEN_AUTO, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "tensor 'w': unknown dtype 'F33'");
	p = make_st("d2.safetensors", "{\"w\":{\"dtype\":\"U16\",\"shape\":[2],"
	            "\"data_offsets\":[0,4]}}", HLEN_AUTO, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EUNSUPPORTED, p,
	           "tensor 'w': dtype U16 is not supported");
	p = make_st("d3.safetensors", "{\"w\":{\"dtype\":\"f32\",\"shape\":[2],"
	            "\"data_offsets\":[0,8]}}", HLEN_AUTO, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "unknown dtype 'f32'");
}
END_TEST

START_TEST(st_rejects_rank_above_max)
{
	kiln_error err;
	const char *p = make_st("r.safetensors", "{\"w\":{\"dtype\":\"U8\",\"shape\":"
	                        "[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", HLEN_AUTO, 1);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EUNSUPPORTED, p, "KILN_MAX_RANK");
}
END_TEST

START_TEST(st_rejects_duplicate_names)
{
	kiln_error err;
	const char *p = make_st("dup.safetensors",
	                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
	                        "\"v\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
	                        "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
	                        HLEN_AUTO, 3);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "duplicate tensor name 'w'");
}
END_TEST

START_TEST(st_rejects_overlapping_tensors)
{
	kiln_error err;
	const char *p = make_st("ov.safetensors",
	                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	                        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
	                        HLEN_AUTO, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "tensors 'a' and 'b' overlap");
	/* the same range named twice would make us allocate it twice */
	p = make_st("ov2.safetensors",
	            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", HLEN_AUTO, 8);
	EXPECT_ERR(st_fail(p, &err), err, KILN_EPARSE, p, "overlap");
	/* empty tensors hold no bytes, so they overlap nothing */
	kiln_tensor_set *s = NULL;
	p = make_st("ov3.safetensors",
	            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	            "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
	            "\"c\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", HLEN_AUTO, 8);
	ck_assert_msg(kiln_safetensors_read(p, &s, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_set_free(s);
}
END_TEST

START_TEST(st_missing_file_is_eio)
{
	kiln_error err;
	const char *p = tpath("absent.safetensors");
	EXPECT_ERR(st_fail(p, &err), err, KILN_EIO, p, "cannot open");
	ck_assert_int_eq(st_fail(p, NULL), KILN_EIO);
	ck_assert_int_eq(kiln_safetensors_read(p, NULL, &err), KILN_EINVAL);
}
END_TEST

/* ---- atomic writes ----------------------------------------------------- */

START_TEST(atomic_write_replaces_existing_file)
{
	kiln_error err;
	const char *p = tpath("f");
	write_file(p, "old", 3);
	ck_assert_int_eq(rt_write_atomic(p, "new!", 4, &err), KILN_OK);
	ck_assert(file_is(p, "new!"));
	ck_assert_int_eq(count_entries(tmpdir), 1);
}
END_TEST

START_TEST(atomic_write_into_missing_dir_is_eio_and_creates_nothing)
{
	kiln_error err;
	const char *p = tpath("nodir/f.safetensors");
	kiln_tensor_set *s = sample_set();
	EXPECT_ERR(kiln_safetensors_write(p, s, &err), err, KILN_EIO, p,
	           "cannot create temporary file");
	kiln_tensor *t = patterned(KILN_F32, 1, (int64_t[]){2});
	EXPECT_ERR(kiln_npy_write(tpath("nodir/t.npy"), t, &err), err, KILN_EIO, "t.npy",
	           "No such file or directory");
	ck_assert_int_eq(count_entries(tmpdir), 0);
	kiln_tensor_free(t);
	kiln_tensor_set_free(s);
}
END_TEST

/* A write that fails half way (here: over RLIMIT_FSIZE) keeps the old file. */
START_TEST(atomic_write_failure_keeps_old_file)
{
	kiln_error err;
	const char *p = tpath("keep");
	write_file(p, "old", 3);
	static char big[8192];
	struct rlimit old;
	ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
	void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
	struct rlimit lim = {4096, old.rlim_max};
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	kiln_status st = rt_write_atomic(p, big, sizeof big, &err);
	setrlimit(RLIMIT_FSIZE, &old);
	signal(SIGXFSZ, prev);
	EXPECT_ERR(st, err, KILN_EIO, p, "write");
	ck_assert(file_is(p, "old"));
	ck_assert_int_eq(count_entries(tmpdir), 1); /* the temporary is gone */
}
END_TEST

/* rename() fails when the target is a non-empty directory. */
START_TEST(atomic_write_failed_rename_removes_temporary)
{
	kiln_error err;
	const char *d = tpath("target");
	ck_assert_int_eq(mkdir(d, 0700), 0);
	write_file(tpath("target/inside"), "x", 1);
	EXPECT_ERR(rt_write_atomic(d, "data", 4, &err), err, KILN_EIO, d, "rename");
	ck_assert_int_eq(count_entries(tmpdir), 1);
	ck_assert_int_eq(count_entries(d), 1);
}
END_TEST

START_TEST(atomic_write_unwritable_dir_keeps_old_file)
{
	kiln_error err;
	if (geteuid() == 0) {
		/* root ignores permission bits, but nobody can create files in /proc */
		size_t n1, n2;
		unsigned char *before = slurp("/proc/version", &n1);
		EXPECT_ERR(rt_write_atomic("/proc/version", "x", 1, &err), err, KILN_EIO,
		           "/proc/version", "cannot create temporary file");
		unsigned char *after = slurp("/proc/version", &n2);
		ck_assert(n1 == n2 && memcmp(before, after, n1) == 0);
		free(before);
		free(after);
		return;
	}
	const char *d = tpath("ro"), *p = tpath("ro/f");
	ck_assert_int_eq(mkdir(d, 0700), 0);
	write_file(p, "old", 3);
	ck_assert_int_eq(chmod(d, 0500), 0);
	kiln_status st = rt_write_atomic(p, "new", 3, &err);
	chmod(d, 0700);
	EXPECT_ERR(st, err, KILN_EIO, p, "Permission denied");
	ck_assert(file_is(p, "old"));
	ck_assert_int_eq(count_entries(d), 1);
}
END_TEST

START_TEST(atomic_write_rejects_bad_arguments)
{
	kiln_error err;
	ck_assert_int_eq(rt_write_atomic(NULL, "x", 1, &err), KILN_EINVAL);
	ck_assert_int_eq(rt_write_atomic("", "x", 1, &err), KILN_EINVAL);
	ck_assert_int_eq(rt_write_atomicv(tpath("x"), NULL, 1, NULL), KILN_EINVAL);
	ck_assert_int_eq(rt_write_atomicv(tpath("x"), NULL, 0, NULL), KILN_OK);
	ck_assert(file_is(tpath("x"), ""));
}
END_TEST

/* ---- the suite --------------------------------------------------------- */

static TCase *tcase(const char *name)
{
	TCase *tc = tcase_create(name);
	tcase_add_checked_fixture(tc, setup, teardown);
	return tc;
}

static Suite *runtime_suite(void)
{
	Suite *s = suite_create("runtime");
	TCase *tc = tcase("dtype");
	tcase_add_test(tc, dtype_names_round_trip);
	tcase_add_test(tc, dtype_sizes_and_float_flags);
	tcase_add_test(tc, status_str_names_every_code);
	tcase_add_test(tc, seterr_accepts_null_err);
	suite_add_tcase(s, tc);

	tc = tcase("tensor");
	tcase_add_test(tc, tensor_new_zeroes_and_aligns_data);
	tcase_add_test(tc, tensor_new_rank0_is_one_element);
	tcase_add_test(tc, tensor_new_zero_dim_makes_empty_tensor);
	tcase_add_test(tc, tensor_new_rejects_bad_rank_dtype_and_dims);
	tcase_add_test(tc, tensor_new_rejects_overflowing_shapes);
	tcase_add_test(tc, tensor_clone_copies_shape_and_data);
	tcase_add_test(tc, tensor_clone_of_caller_built_tensor);
	tcase_add_test(tc, tensor_functions_accept_null);
	suite_add_tcase(s, tc);

	tc = tcase("tensor_set");
	tcase_add_test(tc, set_add_copies_the_tensor);
	tcase_add_test(tc, set_add_replaces_same_name);
	tcase_add_test(tc, set_get_missing_name_is_null);
	tcase_add_test(tc, set_add_rejects_bad_arguments);
	suite_add_tcase(s, tc);

	tc = tcase("npy_roundtrip");
	tcase_add_test(tc, npy_roundtrip_every_dtype);
	tcase_add_test(tc, npy_write_pads_header_like_numpy);
	tcase_add_test(tc, npy_writes_bf16_as_void2_and_1d_shape_as_1_tuple);
	tcase_add_test(tc, npy_write_rejects_bad_arguments);
	suite_add_tcase(s, tc);

	tc = tcase("npy_numpy_files");
	tcase_add_test(tc, npy_reads_numpy_f32_and_i32);
	tcase_add_test(tc, npy_reads_numpy_rank0_i64);
	tcase_add_test(tc, npy_reads_numpy_small_types);
	tcase_add_test(tc, npy_reads_numpy_fortran_order_as_row_major);
	tcase_add_test(tc, npy_reads_numpy_version_2_header);
	suite_add_tcase(s, tc);

	tc = tcase("npy_malformed");
	tcase_add_test(tc, npy_accepts_hand_made_valid_file);
	tcase_add_test(tc, npy_rejects_bad_magic);
	tcase_add_test(tc, npy_rejects_truncated_preamble);
	tcase_add_test(tc, npy_rejects_truncated_header);
	tcase_add_test(tc, npy_rejects_header_len_beyond_file);
	tcase_add_test(tc, npy_rejects_bad_dict_syntax);
	tcase_add_test(tc, npy_rejects_data_size_mismatch);
	tcase_add_test(tc, npy_rejects_dims_that_overflow);
	tcase_add_test(tc, npy_rejects_rank_above_max);
	tcase_add_test(tc, npy_rejects_big_endian_and_unknown_dtypes);
	tcase_add_test(tc, npy_reads_void2_as_bf16);
	tcase_add_test(tc, npy_rejects_unknown_version);
	tcase_add_test(tc, npy_reads_nonzero_bool_bytes_as_true);
	tcase_add_test(tc, npy_missing_file_or_directory_is_eio);
	tcase_add_test(tc, readers_refuse_a_fifo_without_blocking);
	suite_add_tcase(s, tc);

	tc = tcase("safetensors_roundtrip");
	tcase_add_test(tc, st_roundtrip_several_named_tensors);
	tcase_add_test(tc, st_write_matches_rust_library_bytes);
	tcase_add_test(tc, st_write_empty_set_matches_rust_library_bytes);
	tcase_add_test(tc, st_write_orders_by_dtype_then_name);
	tcase_add_test(tc, st_write_rejects_unwritable_sets);
	suite_add_tcase(s, tc);

	tc = tcase("safetensors_torch_files");
	tcase_add_test(tc, st_reads_file_of_torch_tensors);
	tcase_add_test(tc, st_rewrite_of_torch_file_is_byte_identical);
	suite_add_tcase(s, tc);

	tc = tcase("safetensors_malformed");
	tcase_add_test(tc, st_accepts_hand_made_valid_file);
	tcase_add_test(tc, st_rejects_truncated_file);
	tcase_add_test(tc, st_rejects_header_len_beyond_file_or_cap);
	tcase_add_test(tc, st_rejects_bad_json);
	tcase_add_test(tc, st_rejects_offsets_out_of_range_or_reversed);
	tcase_add_test(tc, st_rejects_size_mismatch);
	tcase_add_test(tc, st_rejects_unknown_and_unsupported_dtypes);
	tcase_add_test(tc, st_rejects_rank_above_max);
	tcase_add_test(tc, st_rejects_duplicate_names);
	tcase_add_test(tc, st_rejects_overlapping_tensors);
	tcase_add_test(tc, st_missing_file_is_eio);
	suite_add_tcase(s, tc);

	tc = tcase("atomic_write");
	tcase_add_test(tc, atomic_write_replaces_existing_file);
	tcase_add_test(tc, atomic_write_into_missing_dir_is_eio_and_creates_nothing);
	tcase_add_test(tc, atomic_write_failure_keeps_old_file);
	tcase_add_test(tc, atomic_write_failed_rename_removes_temporary);
	tcase_add_test(tc, atomic_write_unwritable_dir_keeps_old_file);
	tcase_add_test(tc, atomic_write_rejects_bad_arguments);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(runtime_suite)
