/*
 * rt.h: helpers shared inside runtime/, one section per file that owns them.
 *
 * runtime/ is the part of kiln that generated standalone libraries link
 * against, so it depends on libc and libm only: never on ir/ or the rest of
 * the compiler.  Every error leaves through rt_seterr, which fills the
 * caller's kiln_error (when there is one) and returns the code, so a failing
 * path reads `return rt_seterr(err, KILN_EPARSE, "%s: ...", path);`.
 *
 * File formats are little-endian and so is every host kiln supports; the
 * readers copy bytes straight into tensors and rely on that.
 */
#ifndef KILN_RT_H
#define KILN_RT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln's runtime assumes a little-endian host"
#endif

/* ---- tensor.c ---------------------------------------------------------- */

/* Fills err (if non-NULL) with code and the formatted message; returns code. */
kiln_status rt_seterr(kiln_error *err, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The byte size of a dense dt tensor of this shape, if kiln_tensor_new could
 * allocate it: false for a bad dtype or rank, a negative dim, or a size that
 * overflows.  File readers call it before trusting a shape from a file. */
bool rt_shape_bytes(kiln_dtype dt, int rank, const int64_t *shape, size_t *nbytes);

/* Makes every byte of a bool tensor 0 or 1, as KILN_BOOL promises, whatever
 * a file held. */
void rt_fix_bool(kiln_tensor *t);

/* ---- file.c ------------------------------------------------------------ */

/* One piece of a file being written. */
typedef struct rt_chunk {
	const void *data;
	size_t n;
} rt_chunk;

/* Replaces path atomically: writes a temporary file in the same directory,
 * fsyncs it, renames it over path and fsyncs the directory.  On failure the
 * old file is intact, the temporary is gone and the result is KILN_EIO. */
kiln_status rt_write_atomic(const char *path, const void *data, size_t n, kiln_error *err);
/* The same for a file made of nchunks pieces, so that tensor data is written
 * from where it lies instead of being copied into one buffer first. */
kiln_status rt_write_atomicv(const char *path, const rt_chunk *chunks, int nchunks,
                             kiln_error *err);

/* Opens a regular file for reading and reports its size.  Every reader of
 * an input file goes through here: the open does not block (a FIFO or a
 * device given as input is refused at once, not waited on), and anything
 * but a regular file is refused. */
kiln_status rt_open_read(const char *path, int *fd, uint64_t *size, kiln_error *err);
/* The whole file (at most max bytes) in a malloc'd buffer with a NUL after
 * its last byte. */
kiln_status rt_read_file(const char *path, uint64_t max, void **data, size_t *size,
                         kiln_error *err);
/* rt_open_read of dir/rel, where rel must stay inside dir: no absolute
 * path, no ".." component, and its real path (symbolic links resolved)
 * must lie under dir's real path. */
kiln_status rt_open_read_in(const char *dir, const char *rel, int *fd, uint64_t *size,
                            kiln_error *err);
/* Reads exactly n bytes at off; a short read (the file shrank) is KILN_EIO. */
kiln_status rt_pread(int fd, void *buf, size_t n, uint64_t off, const char *path,
                     kiln_error *err);

/* What a file holds, judged by its first bytes, never by its name. */
typedef enum rt_file_kind {
	RT_FILE_UNKNOWN,     /* unreadable, or none of these */
	RT_FILE_KIR,         /* text that (after blanks and # comments) starts "graph" */
	RT_FILE_ONNX,        /* binary that is not one of the others: a protobuf */
	RT_FILE_ELF,         /* \x7fELF: a compiled library */
	RT_FILE_NPY,         /* \x93NUMPY */
	RT_FILE_SAFETENSORS, /* u64 header length, then '{' */
	RT_FILE_TEXT,        /* other text: a .kir that will not parse */
} rt_file_kind;
rt_file_kind rt_file_sniff(const char *path);
const char *rt_file_kind_name(rt_file_kind k); /* "a compiled library (ELF)", ... */

/* ---- pool.c ------------------------------------------------------------ */

typedef struct rt_pool rt_pool; /* also in runtime/model.h */

/* Starts nthreads - 1 workers (nthreads in [2, 256]), each with its own
 * 64-byte aligned GEMM scratch of scratch_floats; the caller is thread 0. */
kiln_status rt_pool_new(int nthreads, uint64_t scratch_floats, rt_pool **out);
void rt_pool_free(rt_pool *p);
int rt_pool_threads(const rt_pool *p); /* 1 for NULL */

/* ---- model.c ----------------------------------------------------------- */

typedef struct rt_model rt_model; /* also in runtime/model.h */

/* Bytes of planned scratch the context holds now (grown, never shrunk). */
size_t rt_model_arena_bytes(const rt_model *m);
/* Threads its parallel loops use (1: no pool). */
int rt_model_threads(const rt_model *m);

#endif /* KILN_RT_H */
