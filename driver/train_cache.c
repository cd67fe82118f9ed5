/*
 * train_cache.c: compiled training libraries for `kiln train`, kept in a
 * cache folder by content hash so that a run compiles its step once and a
 * second run with the same model and options compiles nothing.
 *
 * The key is a 128-bit hash of the train-mode graph's and the eval graph's
 * text (.kir: every node, attribute and constant, not the parameters'
 * data), the train options, the batch, and cg_build_identity (target CPU
 * and features, LLVM and kiln versions, this very build of the compiler and
 * of the runtime archive it links).  Parameter data is left out on purpose:
 * whoever loads the library sets its whole state from the model it holds
 * (kiln_model_set_state), so a model with other weights reuses the entry.
 *
 * An entry is DIR/train-<key>.so, written atomically by kiln_compile_train,
 * plus DIR/train-<key>.so.sum, "<size> <64-bit hash of the bytes>", written
 * atomically after it.  A hit re-hashes the file and loads it only when both
 * agree; a missing, torn or altered entry is compiled again (and said so),
 * so a corrupt file never reaches dlopen.  Without a cache folder (caching
 * off, no home, or a folder that cannot be written) the library goes to a
 * temporary file that is removed once loaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/backend.h"
#include "driver/driver.h"
#include "ir/ir.h"

typedef struct hash128 {
	uint64_t h[2];
} hash128;

/* FNV-1a over 64-bit words (two lanes with other offsets), then bytes. */
static void hash_bytes(hash128 *k, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (; n >= 8; n -= 8, b += 8) {
		uint64_t w;
		memcpy(&w, b, 8);
		k->h[0] = (k->h[0] ^ w) * 0x100000001b3ULL;
		k->h[1] = (k->h[1] ^ (w >> 32 | w << 32)) * 0x100000001b3ULL;
	}
	for (; n; n--, b++) {
		k->h[0] = (k->h[0] ^ *b) * 0x100000001b3ULL;
		k->h[1] = (k->h[1] ^ (*b ^ 0x5a)) * 0x100000001b3ULL;
	}
}

/* A field, then a separator its bytes cannot fake (the length). */
static void hash_field(hash128 *k, const void *p, size_t n)
{
	hash_bytes(k, p, n);
	uint64_t len = n;
	hash_bytes(k, &len, sizeof len);
}

static void hash_str(hash128 *k, const char *s)
{
	hash_field(k, s ? s : "", s ? strlen(s) + 1 : 0);
}

static kiln_status hash_graph(hash128 *k, const kiln_graph *g, kiln_error *err)
{
	char *text = kiln_graph_to_kir(g);
	if (!text)
		return ir_seterr(err, KILN_ENOMEM, "out of memory printing graph '%s'",
		                 kiln_graph_name(g));
	hash_str(k, text);
	free(text);
	return KILN_OK;
}

/* Every field of the options, printed exactly (%a). */
static void hash_opts(hash128 *k, const kiln_train_opts *t, int64_t batch)
{
	char b[1024];
	snprintf(b, sizeof b, "optim %d mom %a damp %a nest %d wd %a b1 %a b2 %a eps %a ams %d "
	         "clip %a accum %d loss %d out %s batch %lld", (int)t->optim, t->momentum,
	         t->dampening, (int)t->nesterov, t->weight_decay, t->beta1, t->beta2, t->eps,
	         (int)t->amsgrad, t->clip_norm, t->accum_steps, (int)t->loss,
	         t->output ? t->output : "(first)", (long long)batch);
	hash_str(k, b);
}

static kiln_status entry_key(const kiln_graph *train, const kiln_graph *eval,
                             const kiln_train_opts *t, int64_t batch,
                             const kiln_compile_opts *co, hash128 *k, kiln_error *err)
{
	*k = (hash128){{0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL}};
	char id[8192];
	kiln_status st = cg_build_identity(co, id, sizeof id, err);
	if (st != KILN_OK)
		return st;
	hash_str(k, "kiln train library 1");
	hash_str(k, id);
	hash_opts(k, t, batch);
	st = hash_graph(k, train, err);
	return st == KILN_OK ? hash_graph(k, eval, err) : st;
}

/* The size and hash of a file's bytes; false when it cannot be read. */
static bool file_hash(const char *path, uint64_t *size, hash128 *k)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0)
		return false;
	*k = (hash128){{0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL}};
	*size = 0;
	bool ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
	char buf[1 << 16];
	for (ssize_t n; ok && (n = read(fd, buf, sizeof buf)) != 0;) {
		if (n < 0) {
			ok = errno == EINTR;
			continue;
		}
		hash_bytes(k, buf, (size_t)n); /* 64 KiB blocks: word-aligned but the last */
		*size += (uint64_t)n;
	}
	close(fd);
	return ok;
}

static void sum_text(char *b, size_t size, uint64_t bytes, const hash128 *k)
{
	snprintf(b, size, "%llu %016llx%016llx\n", (unsigned long long)bytes,
	         (unsigned long long)k->h[0], (unsigned long long)k->h[1]);
}

/* Whether path's bytes are what path.sum says. */
static bool entry_ok(const char *path, const char *sum)
{
	char want[128] = "", got[128];
	FILE *f = fopen(sum, "r");
	if (!f)
		return false;
	bool read = fgets(want, sizeof want, f) != NULL;
	fclose(f);
	uint64_t size;
	hash128 k;
	if (!read || !file_hash(path, &size, &k))
		return false;
	sum_text(got, sizeof got, size, &k);
	return strcmp(want, got) == 0;
}

/* path.sum, atomically. */
static kiln_status write_sum(const char *path, const char *sum, kiln_error *err)
{
	uint64_t size;
	hash128 k;
	char text[128], tmp[4200];
	if (!file_hash(path, &size, &k))
		return ir_seterr(err, KILN_EIO, "%s: cannot read it back: %s", path, strerror(errno));
	sum_text(text, sizeof text, size, &k);
	kiln_status st = cg_temp_file(sum, 0666, tmp, sizeof tmp, err);
	if (st != KILN_OK)
		return st;
	FILE *f = fopen(tmp, "w");
	bool ok = f && fputs(text, f) >= 0;
	ok = (f && fclose(f) == 0) && ok;
	if (!ok) {
		unlink(tmp);
		return ir_seterr(err, KILN_EIO, "%s: cannot write: %s", sum, strerror(errno));
	}
	return cg_commit_file(tmp, sum, err);
}

/* mkdir -p (the last error, if any, stays in errno). */
static bool make_dirs(const char *dir)
{
	char b[4096];
	snprintf(b, sizeof b, "%s", dir);
	for (char *c = b + 1; *c; c++)
		if (*c == '/') {
			*c = 0;
			mkdir(b, 0755);
			*c = '/';
		}
	return mkdir(b, 0755) == 0 || errno == EEXIST;
}

/* "x.so" -> "x.h", the header kiln_compile_train writes beside it. */
static void header_of(const char *so, char *h, size_t size)
{
	size_t n = strlen(so);
	snprintf(h, size, "%.*s.h", (int)(n > 3 ? n - 3 : n), so);
}

/* Compiles into a temporary file (no cache), loads it and removes it. */
static kiln_status compile_temp(const kiln_graph *train, const kiln_graph *eval,
                                const kiln_train_opts *t, int64_t batch,
                                const kiln_compile_opts *co, kiln_model **m, kiln_error *err)
{
	const char *tmpdir = getenv("TMPDIR");
	char dir[4096], path[4200], h[4200];
	snprintf(dir, sizeof dir, "%s/kiln-train-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
	if (!mkdtemp(dir))
		return ir_seterr(err, KILN_EIO, "cannot make a temporary folder '%s': %s", dir,
		                 strerror(errno));
	snprintf(path, sizeof path, "%s/step.so", dir);
	kiln_status st = kiln_compile_train(train, eval, t, batch, path, co, err);
	if (st == KILN_OK)
		st = kiln_load(path, m, err);
	header_of(path, h, sizeof h);
	unlink(path), unlink(h), rmdir(dir);
	return st;
}

kiln_status driver_train_lib(const kiln_graph *train, const kiln_graph *eval,
                             const kiln_train_opts *t, int64_t batch, const char *cache_dir,
                             kiln_model **m, driver_cache_info *info, kiln_error *err)
{
	*m = NULL;
	*info = (driver_cache_info){0};
	kiln_compile_opts co = {.cache_dir = cache_dir};
	hash128 k;
	kiln_status st = entry_key(train, eval, t, batch, &co, &k, err);
	if (st != KILN_OK)
		return st;
	char dirbuf[4096], sum[4300];
	const char *dir = cg_cache_dir(cache_dir, dirbuf, sizeof dirbuf);
	if (!dir || !make_dirs(dir) || access(dir, W_OK) != 0)
		return compile_temp(train, eval, t, batch, &co, m, err);
	snprintf(info->path, sizeof info->path, "%s/train-%016llx%016llx.so", dir,
	         (unsigned long long)k.h[0], (unsigned long long)k.h[1]);
	snprintf(sum, sizeof sum, "%s.sum", info->path);
	bool there = access(info->path, F_OK) == 0 || access(sum, F_OK) == 0;
	if (there && entry_ok(info->path, sum) && kiln_load(info->path, m, err) == KILN_OK) {
		info->hit = true;
		return KILN_OK;
	}
	/* torn, altered or unloadable: compiled again over it */
	info->rebuilt = there;
	unlink(sum);
	st = kiln_compile_train(train, eval, t, batch, info->path, &co, err);
	if (st == KILN_OK)
		st = write_sum(info->path, sum, err);
	return st == KILN_OK ? kiln_load(info->path, m, err) : st;
}
