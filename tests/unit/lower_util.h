/*
 * lower_util.h: helpers the kernel-IR tests share (test_lower.c,
 * test_fusion.c): the module dump as text, counting substrings of it, and
 * the example models of examples/models.h with PyTorch's trained weights.
 *
 * Structural checks read the dump (cg_print's text) rather than the module's
 * structs, so a test says what a reader of the dump would look for.
 */
#ifndef KILN_LOWER_UTIL_H
#define KILN_LOWER_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "codegen/codegen.h"
#include "examples/models.h"

/* cg_print's text of m; the caller frees it. */
static inline char *dump(const cg_module *m)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	ck_assert_ptr_nonnull(f);
	cg_print(m, f);
	fclose(f);
	return text;
}

/* How often needle occurs in hay, overlaps included. */
static inline int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

typedef kiln_value (*model_fn)(kiln_graph *g, kiln_value x);

/* The example model called name, traced on x: f32[N, feat...] (rank dims in
 * all) to "logits", with tests/fixtures/models/<name>.safetensors loaded. */
static inline kiln_graph *trained_model(const char *name, model_fn model, int rank,
                                        const int64_t *feat)
{
	kiln_graph *g = kiln_graph_new(name);
	ck_assert_ptr_nonnull(g);
	int64_t dims[KILN_MAX_RANK] = {kiln_sym(g, "N")};
	memcpy(dims + 1, feat, (rank - 1) * sizeof *feat);
	kiln_output(g, "logits", model(g, kiln_input(g, "x", KILN_F32, rank, dims)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	char path[512];
	snprintf(path, sizeof path, "%s/models/%s.safetensors", KILN_FIXTURES, name);
	kiln_tensor_set *s = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_safetensors_read(path, &s, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_load_params(g, s, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_set_free(s);
	return g;
}

/* The fixture batch for model name (tests/fixtures/models/<name>_input.npy). */
static inline kiln_tensor *model_input(const char *name)
{
	char path[512];
	kiln_tensor *x = NULL;
	kiln_error err = {0};
	snprintf(path, sizeof path, "%s/models/%s_input.npy", KILN_FIXTURES, name);
	ck_assert_msg(kiln_npy_read(path, &x, &err) == KILN_OK, "%s: %s", path, err.msg);
	return x;
}

#endif /* KILN_LOWER_UTIL_H */
