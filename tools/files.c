/*
 * files.c: what every subcommand checks about the files it is given before
 * it does any work: that no output is one of its inputs (or another output),
 * that every destination can be written, what kind a file is by its content,
 * and, at the end, that standard output really got what was printed.
 *
 * Files are compared by identity, not by name: two paths are the same file
 * when stat gives the same st_dev and st_ino (so "./a.onnx", "a.onnx", a
 * symlink and a hard link all match), and two paths that do not exist yet
 * are the same when their folders are the same folder and their last
 * components are equal.  A destination is checked by creating and removing
 * a temporary file in its folder, which is what the atomic writers will do;
 * access(2) would answer "yes" to root on a read-only mount or in /proc.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "tools/tools.h"

/* The folder part of path ("." for a bare name), malloc'd. */
static char *dir_of(const char *path)
{
	char *d = strdup(path);
	if (!d)
		return NULL;
	char *slash = strrchr(d, '/');
	while (slash && slash > d && !slash[1]) { /* "a/b/" is "a/b" */
		*slash = 0;
		slash = strrchr(d, '/');
	}
	if (!slash)
		strcpy(d, ".");
	else if (slash == d)
		d[1] = 0;
	else
		*slash = 0;
	return d;
}

static const char *base_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	return slash ? slash + 1 : path;
}

/* A file's identity: its inode when it exists, else its folder's inode
 * and its name. */
typedef struct ident {
	bool known, exists;
	dev_t dev;
	ino_t ino;
	const char *base;
} ident;

static ident identify(const char *path)
{
	ident id = {.base = base_of(path)};
	struct stat st = {0};
	if (stat(path, &st) == 0) {
		id.known = id.exists = true;
	} else {
		char *d = dir_of(path);
		id.known = d && stat(d, &st) == 0;
		free(d);
	}
	id.dev = st.st_dev, id.ino = st.st_ino;
	return id;
}

static bool same(const ident *a, const ident *b)
{
	if (!a->known || !b->known || a->exists != b->exists)
		return false;
	return a->dev == b->dev && a->ino == b->ino && (a->exists || !strcmp(a->base, b->base));
}

bool files_same(const char *a, const char *b)
{
	ident x = identify(a), y = identify(b);
	return same(&x, &y);
}

bool files_in_dir(const char *file, const char *dir)
{
	char *d = dir_of(file);
	bool in = d && files_same(d, dir);
	free(d);
	return in;
}

int files_check_clash(const tool_file *in, int nin, const tool_file *out, int nout)
{
	for (int i = 0; i < nout; i++) {
		if (!out[i].path)
			continue;
		ident o = identify(out[i].path);
		for (int k = 0; k < nin; k++) {
			if (!in[k].path)
				continue;
			ident x = identify(in[k].path);
			if (same(&o, &x))
				return tool_fail(1, "%s '%s'%s is the same file as %s '%s'%s: kiln will not overwrite "
				            "an input; write the output somewhere else", out[i].flag,
				            out[i].path, out[i].note ? out[i].note : "", in[k].flag,
				            in[k].path, in[k].note ? in[k].note : "");
		}
		for (int k = 0; k < i; k++) {
			if (!out[k].path)
				continue;
			ident x = identify(out[k].path);
			if (same(&o, &x))
				return tool_fail(1, "%s '%s'%s and %s '%s'%s are the same file: each output needs "
				            "its own", out[k].flag, out[k].path, out[k].note ? out[k].note : "",
				            out[i].flag, out[i].path, out[i].note ? out[i].note : "");
		}
	}
	return 0;
}

/* Creates and removes a temporary file in dir: what an atomic write does. */
static int probe_dir(const char *flag, const char *path, const char *dir)
{
	struct stat st;
	if (stat(dir, &st) != 0)
		return tool_fail(1, "%s '%s': the folder '%s' does not exist", flag, path, dir);
	if (!S_ISDIR(st.st_mode))
		return tool_fail(1, "%s '%s': '%s' is not a folder", flag, path, dir);
	size_t n = strlen(dir) + 32;
	char *tmp = malloc(n);
	if (!tmp)
		return tool_fail(1, "out of memory");
	snprintf(tmp, n, "%s/.kiln-probe-XXXXXX", dir);
	int fd = mkstemp(tmp);
	int e = errno;
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	free(tmp);
	if (fd < 0)
		return tool_fail(1, "%s '%s': cannot write in the folder '%s': %s", flag, path, dir, strerror(e));
	return 0;
}

int files_check_dest(const char *flag, const char *path, bool stream)
{
	struct stat st;
	if (!*path)
		return tool_fail(1, "%s: the file name is empty", flag);
	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return tool_fail(1, "%s '%s' is a folder, not a file", flag, path);
		if (!S_ISREG(st.st_mode) && !stream)
			return tool_fail(1, "%s '%s' is not a regular file (it would be replaced)", flag, path);
		if (stream && S_ISFIFO(st.st_mode)) {
			/* opening and closing it would hand its reader an end of file */
			if (access(path, W_OK) != 0)
				return tool_fail(1, "%s '%s': cannot write: %s", flag, path, strerror(errno));
			return 0;
		}
		if (stream) { /* written in place: the file itself must open for writing */
			int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
			if (fd < 0)
				return tool_fail(1, "%s '%s': cannot write: %s", flag, path, strerror(errno));
			close(fd);
			if (!S_ISREG(st.st_mode))
				return 0;
		}
	}
	char *d = dir_of(path);
	int rc = d ? probe_dir(flag, path, d) : tool_fail(1, "out of memory");
	free(d);
	return rc;
}

int files_check_dir(const char *flag, const char *dir)
{
	struct stat st;
	if (!*dir)
		return tool_fail(1, "%s: the folder name is empty", flag);
	if (stat(dir, &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			return tool_fail(1, "%s '%s' is not a folder", flag, dir);
		return probe_dir(flag, dir, dir);
	}
	char *d = dir_of(dir); /* it will be made: its parent must take it */
	int rc = d ? probe_dir(flag, dir, d) : tool_fail(1, "out of memory");
	free(d);
	return rc;
}

char *files_swap_ext(const char *path, const char *ext, const char *with)
{
	size_t n = strlen(path), e = strlen(ext);
	if (n >= e && !strcmp(path + n - e, ext))
		n -= e;
	char *p = malloc(n + strlen(with) + 1);
	if (p) {
		memcpy(p, path, n);
		strcpy(p + n, with);
	}
	return p;
}

char *files_model_sidecar(const char *model)
{
	kiln_file_kind k = kiln_file_sniff(model);
	return k == KILN_FILE_KIR || k == KILN_FILE_TEXT ? files_swap_ext(model, ".kir", ".safetensors")
	                                             : NULL;
}

int files_sync_dir(const char *path)
{
	char *d = dir_of(path);
	int fd = d ? open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	int rc = 0;
	if (fd >= 0 && fsync(fd) != 0 && errno != EINVAL)
		rc = tool_fail(1, "'%s': fsync of the folder '%s': %s", path, d, strerror(errno));
	if (fd >= 0)
		close(fd);
	free(d);
	return rc;
}

int files_finish_stdout(void)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		int e = errno;
		return tool_fail(1, "cannot write to standard output: %s", strerror(e ? e : EIO));
	}
	return 0;
}
