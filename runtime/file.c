/*
 * file.c: the file I/O under the tensor formats: atomic replacement on
 * write, bounded reads on read.
 *
 * A write goes to a fresh temporary beside the target (same directory, so
 * same file system, so rename is atomic), is fsynced, renamed over the
 * target, and the directory is fsynced so the rename itself survives a
 * crash.  Until the rename the old file is untouched; any failure before it
 * unlinks the temporary.  The temporary is opened with O_EXCL and mode 0666,
 * letting the umask decide permissions as for any new file (mkstemp would
 * force 0600).
 *
 * Reads use pread on a descriptor whose size was taken once with fstat:
 * parsers check every length from a file against that size before they
 * allocate or read, so a hostile file cannot make them allocate more memory
 * than the file holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

static kiln_status ioerr(kiln_error *err, const char *path, const char *what, int e)
{
	return rt_seterr(err, KILN_EIO, "%s: %s: %s", path, what, strerror(e));
}

/* Creates a temporary named path.tmp<pid>.<seq>; NULL with errno on failure. */
static char *open_temp(const char *path, int *fd)
{
	static atomic_uint seq;
	size_t size = strlen(path) + 48;
	char *tmp = malloc(size);
	if (!tmp) {
		errno = ENOMEM;
		return NULL;
	}
	for (int tries = 0; tries < 100; tries++) {
		snprintf(tmp, size, "%s.tmp%ld.%u", path, (long)getpid(),
		         atomic_fetch_add(&seq, 1));
		*fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (*fd >= 0)
			return tmp;
		if (errno != EEXIST)
			break;
	}
	int e = errno;
	free(tmp);
	errno = e;
	return NULL;
}

static int write_all(int fd, const void *data, size_t n)
{
	const char *p = data;
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? errno : EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Best effort: a directory we cannot open (no read permission) still got
 * the rename; only a failing fsync is reported. */
static int sync_dir(const char *path)
{
	char *dir = strdup(path);
	if (!dir)
		return ENOMEM;
	char *slash = strrchr(dir, '/');
	if (!slash)
		strcpy(dir, ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (fd < 0)
		return 0;
	int e = fsync(fd) < 0 && errno != EINVAL ? errno : 0;
	close(fd);
	return e;
}

kiln_status rt_write_atomicv(const char *path, const rt_chunk *chunks, int nchunks,
                             kiln_error *err)
{
	if (!path || !*path || nchunks < 0 || (nchunks > 0 && !chunks))
		return rt_seterr(err, KILN_EINVAL, "write: bad arguments");
	int fd;
	char *tmp = open_temp(path, &fd);
	if (!tmp)
		return ioerr(err, path, "cannot create temporary file", errno);
	int e = 0;
	const char *what = "write";
	for (int i = 0; i < nchunks && !e; i++)
		e = write_all(fd, chunks[i].data, chunks[i].n);
	if (!e && fsync(fd) < 0)
		e = errno, what = "fsync";
	if (close(fd) < 0 && !e)
		e = errno, what = "close";
	if (!e && rename(tmp, path) < 0)
		e = errno, what = "rename";
	if (e) {
		unlink(tmp);
		free(tmp);
		return ioerr(err, path, what, e);
	}
	free(tmp);
	if ((e = sync_dir(path)) != 0)
		return ioerr(err, path, "fsync of directory", e);
	return KILN_OK;
}

kiln_status rt_write_atomic(const char *path, const void *data, size_t n, kiln_error *err)
{
	rt_chunk c = {data, n};
	return rt_write_atomicv(path, &c, 1, err);
}

KILN_API kiln_status kiln_write_file(const char *path, const void *data, size_t size,
                                     kiln_error *err)
{
	return rt_write_atomic(path, data, size, err);
}

kiln_status rt_open_read(const char *path, int *fd, uint64_t *size, kiln_error *err)
{
	*fd = -1;
	if (!path)
		return rt_seterr(err, KILN_EINVAL, "read: path is NULL");
	/* O_NONBLOCK: opening a FIFO or a device must not hang; such files are
	 * refused below, and a regular file gets blocking reads back. */
	int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (f < 0)
		return ioerr(err, path, "cannot open", errno);
	struct stat st;
	int flags;
	if (fstat(f, &st) < 0) {
		int e = errno;
		close(f);
		return ioerr(err, path, "cannot stat", e);
	}
	if (S_ISREG(st.st_mode) && ((flags = fcntl(f, F_GETFL)) < 0 ||
	                            fcntl(f, F_SETFL, flags & ~O_NONBLOCK) < 0)) {
		int e = errno;
		close(f);
		return ioerr(err, path, "fcntl", e);
	}
	if (!S_ISREG(st.st_mode)) {
		close(f);
		return rt_seterr(err, KILN_EIO, "%s: not a regular file (a %s)", path,
		                 S_ISFIFO(st.st_mode)  ? "FIFO"
		                 : S_ISDIR(st.st_mode) ? "directory"
		                 : S_ISSOCK(st.st_mode) ? "socket"
		                                        : "device");
	}
	*fd = f;
	*size = (uint64_t)st.st_size;
	return KILN_OK;
}

kiln_status rt_read_file(const char *path, uint64_t max, void **data, size_t *size,
                         kiln_error *err)
{
	*data = NULL;
	*size = 0;
	int fd;
	uint64_t n = 0; /* set when rt_open_read succeeds; 0 quiets -Wmaybe-uninitialized at -O2 */
	kiln_status st = rt_open_read(path, &fd, &n, err);
	if (st != KILN_OK)
		return st;
	char *buf = NULL;
	if (n > max || n > SIZE_MAX - 1)
		st = rt_seterr(err, KILN_EIO, "%s: file too large (%llu bytes; at most %llu)", path,
		               (unsigned long long)n, (unsigned long long)max);
	else if (!(buf = malloc((size_t)n + 1)))
		st = rt_seterr(err, KILN_ENOMEM, "%s: out of memory", path);
	else if ((st = rt_pread(fd, buf, (size_t)n, 0, path, err)) == KILN_OK)
		buf[n] = 0;
	close(fd);
	if (st != KILN_OK) {
		free(buf);
		return st;
	}
	*data = buf;
	*size = (size_t)n;
	return KILN_OK;
}

/* Whether rel, a relative path, has a ".." component. */
static bool has_dotdot(const char *rel)
{
	for (const char *p = rel; *p;) {
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.')
			return true;
		p += n;
		p += *p == '/';
	}
	return false;
}

kiln_status rt_open_read_in(const char *dir, const char *rel, int *fd, uint64_t *size,
                            kiln_error *err)
{
	*fd = -1;
	if (!dir || !rel || !*rel || rel[0] == '/' || has_dotdot(rel))
		return rt_seterr(err, KILN_EINVAL, "'%s' must be a relative path inside the "
		                 "folder '%s', without '..'", rel ? rel : "", dir ? dir : "");
	size_t n = strlen(dir) + strlen(rel) + 2;
	char *joined = malloc(n), *rdir = NULL, *rfile = NULL;
	kiln_status st = KILN_OK;
	if (!joined)
		return rt_seterr(err, KILN_ENOMEM, "out of memory");
	snprintf(joined, n, "%s/%s", dir, rel);
	/* Links are resolved on both sides: a symlink inside the folder may
	 * point at another file inside it, never outside. */
	if (!(rdir = realpath(dir, NULL)))
		st = ioerr(err, dir, "cannot resolve the folder", errno);
	else if (!(rfile = realpath(joined, NULL)))
		st = ioerr(err, joined, "cannot open", errno);
	else {
		size_t k = strlen(rdir);
		bool root = k == 1 && rdir[0] == '/';
		if (!root && (strncmp(rfile, rdir, k) != 0 || rfile[k] != '/'))
			st = rt_seterr(err, KILN_EINVAL, "%s: resolves to '%s', outside the folder "
			               "'%s' (a symbolic link?); refused", joined, rfile, rdir);
	}
	if (st == KILN_OK)
		st = rt_open_read(rfile, fd, size, err);
	free(joined), free(rdir), free(rfile);
	return st;
}

kiln_status rt_pread(int fd, void *buf, size_t n, uint64_t off, const char *path,
                     kiln_error *err)
{
	char *p = buf;
	while (n > 0) {
		/* Linux moves at most about 2 GiB per call; ask for less. */
		size_t want = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
		ssize_t r = pread(fd, p, want, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return ioerr(err, path, "read", errno);
		if (r == 0)
			return rt_seterr(err, KILN_EIO, "%s: file ended early (changed while read?)",
			                 path);
		p += r;
		off += (uint64_t)r;
		n -= (size_t)r;
	}
	return KILN_OK;
}

rt_file_kind rt_file_sniff(const char *path)
{
	unsigned char b[512];
	int fd = path ? open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
	struct stat st;
	if (fd < 0)
		return RT_FILE_UNKNOWN;
	ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, b, sizeof b, 0) : -1;
	close(fd);
	if (n < 0)
		return RT_FILE_UNKNOWN;
	if (n >= 4 && !memcmp(b, "\x7f" "ELF", 4))
		return RT_FILE_ELF;
	if (n >= 6 && !memcmp(b, "\x93NUMPY", 6))
		return RT_FILE_NPY;
	if (n >= 9 && b[8] == '{' && !b[7] && !b[6] && !b[5])
		return RT_FILE_SAFETENSORS;
	bool text = true;
	for (ssize_t i = 0; i < n && text; i++)
		text = b[i] >= 0x20 || b[i] == '\t' || b[i] == '\n' || b[i] == '\r' || b[i] >= 0x80;
	if (!text)
		return RT_FILE_ONNX;
	ssize_t i = 0;
	for (;;) {
		while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
			i++;
		if (i < n && b[i] == '#') {
			while (i < n && b[i] != '\n')
				i++;
			continue;
		}
		break;
	}
	return n - i >= 5 && !memcmp(b + i, "graph", 5) ? RT_FILE_KIR : RT_FILE_TEXT;
}

const char *rt_file_kind_name(rt_file_kind k)
{
	static const char *const name[] = {
		[RT_FILE_UNKNOWN] = "an unreadable file", [RT_FILE_KIR] = "a .kir graph",
		[RT_FILE_ONNX] = "an ONNX model", [RT_FILE_ELF] = "a compiled library (ELF shared object)",
		[RT_FILE_NPY] = "a NumPy array (.npy)", [RT_FILE_SAFETENSORS] = "a safetensors file",
		[RT_FILE_TEXT] = "a text file"};
	return (unsigned)k < sizeof name / sizeof *name ? name[k] : "?";
}

/* The public names of the same (kiln.h): one enum in the same order. */
_Static_assert((int)KILN_FILE_UNKNOWN == RT_FILE_UNKNOWN && (int)KILN_FILE_KIR == RT_FILE_KIR &&
               (int)KILN_FILE_ONNX == RT_FILE_ONNX && (int)KILN_FILE_ELF == RT_FILE_ELF &&
               (int)KILN_FILE_NPY == RT_FILE_NPY &&
               (int)KILN_FILE_SAFETENSORS == RT_FILE_SAFETENSORS &&
               (int)KILN_FILE_TEXT == RT_FILE_TEXT,
               "kiln_file_kind and rt_file_kind differ");

KILN_API kiln_file_kind kiln_file_sniff(const char *path)
{
	return (kiln_file_kind)rt_file_sniff(path);
}

KILN_API const char *kiln_file_kind_name(kiln_file_kind k)
{
	return rt_file_kind_name((rt_file_kind)k);
}
