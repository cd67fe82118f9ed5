/*
 * testutil.c: the shared test helpers of testutil.h.  Each was written
 * once per test before (test_compiled_ops.c, test_cuda.c,
 * test_compiled_models.c, run_conformance.c, cuda_nvrtc_check.c); one copy
 * keeps the tolerance policy and the temporary-folder handling the same
 * for every backend the tests compare.
 */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void tu_remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	for (struct dirent *e; d && (e = readdir(d));) {
		char path[4200];
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
		    snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
			unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

char *tu_slurp(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *t = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (t && fread(t, 1, (size_t)n, f) != (size_t)n) {
		free(t);
		t = NULL;
	}
	if (t)
		t[n] = 0;
	fclose(f);
	if (size)
		*size = t ? (size_t)n : 0;
	return t;
}

double tu_tolerance(const kiln_tensor *want, double case_tol)
{
	switch (want->dtype) {
	case KILN_F32: case KILN_F16: case KILN_BF16:
		return case_tol > 1e-4 ? case_tol : 1e-4;
	default:
		return case_tol;
	}
}

const char *tu_reason_of(const tu_reason *list, const char *name)
{
	for (int i = 0; list[i].name; i++)
		if (!strcmp(list[i].name, name))
			return list[i].reason;
	return NULL;
}

kiln_status tu_compile_run(const kiln_graph *g, const kiln_compile_opts *o, const char *prefix,
                           kiln_tensor *const *in, int nin, kiln_tensor **out, int nout,
                           kiln_error *err)
{
	const char *tmp = getenv("TMPDIR");
	char dir[1024], so[1200];
	snprintf(dir, sizeof dir, "%s/%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
	if (!mkdtemp(dir)) {
		if (err)
			err->code = KILN_EIO, snprintf(err->msg, sizeof err->msg, "cannot make a "
			                                "temporary folder %.900s", dir);
		return KILN_EIO;
	}
	snprintf(so, sizeof so, "%s/%s.so", dir, o && o->name ? o->name : "model");
	kiln_model *m = NULL;
	kiln_status st = kiln_compile(g, so, o, err);
	if (st == KILN_OK)
		st = kiln_load(so, &m, err);
	tu_remove_dir(dir);
	if (st == KILN_OK)
		st = kiln_model_run(m, in, nin, out, nout, err);
	kiln_model_free(m);
	return st;
}
