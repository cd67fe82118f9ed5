/*
 * kir_io.c: the public face of textual IR: graphs to and from .kir text,
 * and saving/loading a graph as FILE.kir plus its weights in
 * FILE.safetensors.
 *
 * The text holds the graph's structure and the declared type of every
 * parameter; the weights go to safetensors under the parameters' names, so
 * a .kir file stays readable and diffable and the weights stay loadable by
 * PyTorch.  Both files are written atomically (temporary, fsync, rename),
 * weights first: a crash between the two leaves the old .kir, which a
 * mismatched weight file makes fail loudly on load rather than silently.
 * A graph without parameters removes a stale FILE.safetensors, so that load
 * never pairs a graph with weights saved for another one.  A .kir with
 * parameters whose FILE.safetensors is missing loads (inspect and opt need
 * no weights) but is marked, and run, compile, export and train refuse it
 * rather than use all-zero weights; saving it writes no weights file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir/ir.h"
#include "runtime/rt.h"

/* .kir files hold whole constants, but more than this is not a graph */
#define KIR_MAX_FILE ((uint64_t)1 << 31)

KILN_API char *kiln_graph_to_kir(const kiln_graph *g)
{
	return ir_print(g);
}

KILN_API kiln_status kiln_graph_from_kir(const char *text, const char *filename,
                                         kiln_graph **out, kiln_error *err)
{
	kiln_graph *g = NULL;
	if (out)
		*out = NULL;
	kiln_status st = ir_parse(text, filename, &g, err);
	if (st != KILN_OK)
		return st;
	if ((st = ir_verify(g, err)) != KILN_OK) {
		kiln_graph_free(g);
		return st;
	}
	*out = g;
	return KILN_OK;
}

/* FILE.kir -> FILE.safetensors (any other name gets the suffix appended). */
static char *weights_path(const char *kir_path)
{
	size_t n = strlen(kir_path);
	if (n >= 4 && strcmp(kir_path + n - 4, ".kir") == 0)
		n -= 4;
	char *p = malloc(n + sizeof ".safetensors");
	if (p) {
		memcpy(p, kir_path, n);
		memcpy(p + n, ".safetensors", sizeof ".safetensors");
	}
	return p;
}

static bool has_params(const kiln_graph *g)
{
	for (uint32_t i = 1; i < g->nval; i++)
		if (g->val[i]->kind == IR_V_PARAM)
			return true;
	return false;
}

static kiln_status save_weights(const kiln_graph *g, const char *path, kiln_error *err)
{
	/* a graph loaded without its weights is saved without them too, so the
	 * copy is refused as the original is instead of getting zeros */
	if (!has_params(g) || g->weights_missing) {
		if (unlink(path) != 0 && errno != ENOENT)
			return ir_seterr(err, KILN_EIO, "%s: cannot remove stale weights: %s", path,
			                 strerror(errno));
		return KILN_OK;
	}
	kiln_tensor_set *s = kiln_graph_params(g);
	if (!s)
		return ir_seterr(err, KILN_ENOMEM, "out of memory collecting parameters");
	kiln_status st = kiln_safetensors_write(path, s, err);
	kiln_tensor_set_free(s);
	return st;
}

KILN_API kiln_status kiln_graph_save(const kiln_graph *g, const char *kir_path,
                                     kiln_error *err)
{
	if (!g || !kir_path)
		return ir_seterr(err, KILN_EINVAL, "kiln_graph_save: null argument");
	char *text = ir_print(g), *wpath = weights_path(kir_path);
	kiln_status st = KILN_ENOMEM;
	if (!text || !wpath)
		ir_seterr(err, st, "out of memory printing graph '%s'", g->name);
	else if ((st = save_weights(g, wpath, err)) == KILN_OK)
		st = rt_write_atomic(kir_path, text, strlen(text), err);
	free(text);
	free(wpath);
	return st;
}

/* Reads a whole text file into a NUL-terminated malloc'd buffer. */
static kiln_status read_text(const char *path, char **out, kiln_error *err)
{
	int fd;
	uint64_t size;
	kiln_status st = rt_open_read(path, &fd, &size, err);
	if (st != KILN_OK)
		return st;
	char *text = NULL;
	if (size > KIR_MAX_FILE)
		st = ir_seterr(err, KILN_EIO, "%s: file too large for a .kir (%llu bytes)", path,
		               (unsigned long long)size);
	else if (!(text = malloc(size + 1)))
		st = ir_seterr(err, KILN_ENOMEM, "%s: out of memory", path);
	else if ((st = rt_pread(fd, text, size, 0, path, err)) == KILN_OK)
		text[size] = 0;
	close(fd);
	if (st == KILN_OK && memchr(text, 0, size))
		st = ir_seterr(err, KILN_EPARSE, "%s: a .kir file must not contain NUL bytes", path);
	if (st != KILN_OK) {
		free(text);
		return st;
	}
	*out = text;
	return KILN_OK;
}

/* "path: " + the message already in err (load_params does not know the file) */
static void prefix_msg(kiln_error *err, const char *path)
{
	if (!err)
		return;
	char msg[sizeof err->msg];
	memcpy(msg, err->msg, sizeof msg);
	int n = snprintf(err->msg, sizeof err->msg, "%s: ", path);
	if (n < 0 || (size_t)n >= sizeof err->msg)
		return;
	size_t len = strnlen(msg, sizeof msg - 1), room = sizeof err->msg - n - 1;
	memcpy(err->msg + n, msg, len < room ? len : room);
	err->msg[n + (len < room ? len : room)] = 0;
}

/* A missing weights file is not an error here: inspecting or optimising
 * the graph needs no weights.  It is recorded, and running, compiling,
 * exporting or training the graph refuses it (ir_check_weights). */
static kiln_status load_weights(kiln_graph *g, const char *path, kiln_error *err)
{
	if (access(path, F_OK) != 0 && errno == ENOENT) {
		if (has_params(g) && !(g->weights_missing = ir_intern(g, path)))
			return ir_seterr(err, KILN_ENOMEM, "out of memory");
		return KILN_OK;
	}
	kiln_tensor_set *s = NULL;
	kiln_status st = kiln_safetensors_read(path, &s, err);
	if (st == KILN_OK && (st = kiln_graph_load_params(g, s, err)) != KILN_OK)
		prefix_msg(err, path);
	kiln_tensor_set_free(s);
	return st;
}

KILN_API kiln_status kiln_graph_load(const char *kir_path, kiln_graph **out, kiln_error *err)
{
	if (out)
		*out = NULL;
	if (!kir_path || !out)
		return ir_seterr(err, KILN_EINVAL, "kiln_graph_load: null argument");
	char *text = NULL, *wpath = NULL;
	kiln_graph *g = NULL;
	kiln_status st = read_text(kir_path, &text, err);
	if (st == KILN_OK)
		st = kiln_graph_from_kir(text, kir_path, &g, err);
	if (st == KILN_OK && !(wpath = weights_path(kir_path)))
		st = ir_seterr(err, KILN_ENOMEM, "out of memory");
	if (st == KILN_OK)
		st = load_weights(g, wpath, err);
	free(text);
	free(wpath);
	if (st != KILN_OK) {
		kiln_graph_free(g);
		return st;
	}
	*out = g;
	return KILN_OK;
}
