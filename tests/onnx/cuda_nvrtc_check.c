/*
 * cuda_nvrtc_check.c: every model under the given paths printed as CUDA C
 * by the CUDA backend and compiled by NVRTC for each architecture, with
 * warnings counted as failures (issue #14's acceptance: the kernels of the
 * ONNX conformance cases and the real models compile for sm_80 and sm_90).
 *
 *   cuda_nvrtc_check [--arch sm_80,sm_90] [--every K] [--train B] PATH...
 *
 * --train B compiles each model's training step at batch B instead (SGD
 * with momentum, cross-entropy: kiln compile --train --target=cuda), the
 * step and the eval program in one text.
 * PATH is a .onnx or .kir file or a folder searched for them.  A model
 * that does not load, or that the lowering refuses (the CPU library would
 * fail too), is counted and left out; a kernel the backend's supports()
 * refuses is counted as refused and printed.  Models are printed with
 * their own name prefix and compiled many to one NVRTC program (cubin for
 * each architecture, PTX for the last); a program that fails is compiled
 * model by model to name the culprits.  --every K takes every K-th model
 * (sorted by path), to keep a test short.  Exit 0 when nothing failed, 1
 * otherwise, 77 (skipped) when this kiln was built without NVRTC.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cuda.h"
#include "kiln/kiln.h"
#include "../unit/testutil.h"

typedef struct list {
	char **p;
	int n, cap;
} list;

static void push(list *l, const char *s)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 256;
		l->p = realloc(l->p, (size_t)l->cap * sizeof *l->p);
		if (!l->p)
			exit(2);
	}
	l->p[l->n++] = strdup(s);
}

static bool ends(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static void walk(list *l, const char *path)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return;
	if (!S_ISDIR(st.st_mode)) {
		if (ends(path, ".onnx") || ends(path, ".kir"))
			push(l, path);
		return;
	}
	DIR *d = opendir(path);
	for (struct dirent *e; d && (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		char sub[4096];
		if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) < (int)sizeof sub)
			walk(l, sub);
	}
	if (d)
		closedir(d);
}

static int cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* --train B: g's training step instead (kiln_train_graph_from_inference:
 * BatchNorm on batch statistics, SGD with momentum, cross-entropy), at
 * batch B, printed with its eval program as kiln compile --train
 * --target=cuda --emit=cu prints them. */
static int64_t train_batch;

static kiln_status compile_train(const kiln_graph *g, int64_t batch, const char *cu,
                                 const kiln_compile_opts *o, kiln_error *err)
{
	kiln_graph *tg = NULL;
	kiln_train_opts t = {.optim = KILN_OPT_SGD, .momentum = 0.9, .weight_decay = 5e-4,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	kiln_status st = kiln_train_graph_from_inference(g, 1, &tg, err);
	if (st == KILN_OK)
		st = kiln_compile_train(tg, g, &t, batch, cu, o, err);
	kiln_graph_free(tg);
	return st;
}

static char archs[8][16];
static int narch;

/* Failures of text for every architecture (cubin each, PTX for the last). */
static int nvrtc(const char *text, const char *name, bool say)
{
	int bad = 0;
	for (int a = 0; a <= narch; a++) {
		bool ptx = a == narch;
		const char *arch = archs[ptx ? narch - 1 : a];
		void *img = NULL;
		size_t n = 0;
		kiln_error err = {0};
		if (cg_nvrtc_compile(text, name, arch, ptx, true, false, &img, &n, &err) != KILN_OK) {
			if (say)
				printf("FAIL %s (%s %s): %.600s\n", name, arch, ptx ? "ptx" : "cubin", err.msg);
			bad++;
		}
		free(img);
	}
	return bad;
}

int main(int argc, char **argv)
{
	const char *arch = "sm_80,sm_90";
	int every = 1;
	list paths = {0};
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--arch") && i + 1 < argc)
			arch = argv[++i];
		else if (!strcmp(argv[i], "--train") && i + 1 < argc)
			train_batch = atoll(argv[++i]) > 0 ? atoll(argv[i]) : 1;
		else if (!strcmp(argv[i], "--every") && i + 1 < argc)
			every = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
		else
			walk(&paths, argv[i]);
	}
	if (!cg_nvrtc_available()) {
		printf("skipped: this kiln was built without the CUDA toolkit (no NVRTC)\n");
		return 77;
	}
	for (const char *a = arch; *a && narch < 8;) {
		size_t n = strcspn(a, ",");
		snprintf(archs[narch++], sizeof archs[0], "%.*s", (int)n, a);
		a += n + (a[n] == ',');
	}
	qsort(paths.p, (size_t)paths.n, sizeof *paths.p, cmp);
	char dir[] = "/tmp/kiln_nvrtc_check.XXXXXX";
	if (!mkdtemp(dir))
		return 2;
	int models = 0, unloaded = 0, unlowered = 0, refused = 0, failed = 0, programs = 0;
	long kernels = 0;
	enum { PER = 64 };
	char *texts[PER];
	const char *names[PER];
	int nt = 0;
	size_t total = 0;
	for (int i = 0; i <= paths.n; i++) {
		bool last = i == paths.n;
		if (!last && i % every == 0) {
			kiln_graph *g = NULL;
			kiln_error err = {0};
			char cu[4200], name[32];
			snprintf(name, sizeof name, "m%d", i);
			snprintf(cu, sizeof cu, "%s/%s.cu", dir, name);
			if (kiln_graph_load_any(paths.p[i], &g, &err) != KILN_OK) {
				unloaded++;
			} else {
				kiln_compile_opts o = {.name = name, .target = "cuda", .emit = "cu"};
				kiln_status st = train_batch > 0 ? compile_train(g, train_batch, cu, &o, &err)
				                                 : kiln_compile(g, cu, &o, &err);
				char *t = st == KILN_OK ? tu_slurp(cu, NULL) : NULL;
				unlink(cu);
				if (st != KILN_OK && strstr(err.msg, "backend 'cuda' cannot take")) {
					printf("REFUSED %s: %s\n", paths.p[i], err.msg);
					refused++;
				} else if (st != KILN_OK && train_batch) {
					/* a training step that does not build is a failure */
					printf("FAIL %s (train step): %.600s\n", paths.p[i], err.msg);
					failed++;
				} else if (st != KILN_OK) {
					unlowered++;
				} else if (t) {
					models++;
					for (const char *p = t; (p = strstr(p, "KILN_KERNEL void ")); p++)
						kernels++;
					texts[nt] = t, names[nt++] = paths.p[i];
					total += strlen(t);
				}
			}
			kiln_graph_free(g);
		}
		if (nt && (last || nt == PER || total > (8u << 20))) {
			char *all = malloc(total + 1);
			if (!all)
				return 2;
			size_t at = 0;
			for (int k = 0; k < nt; k++) {
				size_t n = strlen(texts[k]);
				memcpy(all + at, texts[k], n);
				at += n;
			}
			all[at] = 0;
			programs++;
			if (nvrtc(all, "models.cu", false))
				for (int k = 0; k < nt; k++)
					failed += nvrtc(texts[k], names[k], true) != 0;
			free(all);
			for (int k = 0; k < nt; k++)
				free(texts[k]);
			nt = 0, total = 0;
		}
	}
	rmdir(dir);
	printf("cuda_nvrtc_check: %d %s (%ld launches) printed as CUDA C and compiled in %d "
	       "NVRTC programs for %s (cubin) and PTX; %d failed; %d refused by the backend; "
	       "%d not lowered, %d not loaded (left out)\n", models,
	       train_batch ? "training steps" : "models", kernels, programs, arch,
	       failed, refused, unlowered, unloaded);
	for (int i = 0; i < paths.n; i++)
		free(paths.p[i]);
	free(paths.p);
	return failed || refused ? 1 : 0;
}
