/*
 * cuda_emit.c: the CUDA backends (backend.h) around the printer (cuda.c).
 *
 * `cuda` writes the kernels as CUDA C (stage "cu"), PTX ("ptx") or a cubin
 * ("cubin") for the first of --cuda-arch, compiled by NVRTC
 * (cuda_nvrtc.c).  `cuda-emu` is for tests: the same CUDA C compiled as
 * C++ for the host (KILN_CUDA_EMULATE: launches are loops over blocks and
 * threads) into a library that kiln_load runs like any other, its
 * description (runtime/model.h) printed here as C++, so the printed
 * kernels are checked against the interpreter on a machine without a GPU.
 * It needs the kiln source tree's headers (KILN_SOURCE_DIR, this build's)
 * and a C++ compiler (c++).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/backend.h"
#include "codegen/cuda.h"
#include "runtime/model.h"
#include "runtime/rt.h"

struct cg_session {
	const cg_library *lib;
	bool emu;
	char *text;      /* the printed kernels: the step's, then (training) the eval program's */
	size_t eval_at;  /* where the eval program's text starts (0: there is none) */
	void *img[17];   /* NVRTC's images: the blob borrows them until it is written */
	int nimg;
};

static bool supports(const cg_module *m, const cg_kernel *k, char *why, size_t size)
{
	return cg_cuda_supports(m, k, why, size);
}

static kiln_status open_s(cg_session **out, const cg_library *lib, bool emu, kiln_error *err)
{
	cg_session *s = calloc(1, sizeof *s);
	if (!s)
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	s->lib = lib, s->emu = emu;
	*out = s;
	return KILN_OK;
}

static kiln_status open_cuda(cg_session **out, const cg_library *lib, kiln_error *err)
{
	return open_s(out, lib, false, err);
}

static kiln_status open_emu(cg_session **out, const cg_library *lib, kiln_error *err)
{
	return open_s(out, lib, true, err);
}

/* m's kernels, prefixed with the library's name; a training library's
 * eval program (lib->eval) with "<name>_eval" and appended to the step's
 * text, one translation unit (the prelude is printed once). */
static kiln_status emit_kernels(cg_session *s, const cg_module *m, kiln_error *err)
{
	char pre[160];
	bool eval = m == s->lib->eval && s->text;
	snprintf(pre, sizeof pre, "%s%s", s->lib->name, eval ? "_eval" : "");
	char *t = cg_cuda_print(m, &(cg_cuda_opts){.emulate = s->emu, .prefix = pre});
	if (!t)
		return ir_seterr(err, KILN_ENOMEM, "out of memory printing CUDA C");
	if (!eval) {
		s->text = t;
		return KILN_OK;
	}
	size_t a = strlen(s->text), b = strlen(t);
	char *both = realloc(s->text, a + b + 1);
	if (!both) {
		free(t);
		return ir_seterr(err, KILN_ENOMEM, "out of memory printing CUDA C");
	}
	memcpy(both + a, t, b + 1);
	free(t);
	s->text = both;
	s->eval_at = a;
	return KILN_OK;
}

static kiln_status emit_library(cg_session *s, kiln_error *err)
{
	return KILN_OK;
}

static void close_s(cg_session *s)
{
	for (int i = 0; s && i < s->nimg; i++)
		free(s->img[i]);
	if (s)
		free(s->text);
	free(s);
}

/* The first of a comma-separated --cuda-arch list (default sm_80). */
static void first_arch(const kiln_compile_opts *o, char *out, size_t size)
{
	const char *a = o && o->cuda_arch && *o->cuda_arch ? o->cuda_arch : "sm_80";
	size_t n = strcspn(a, ",");
	snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), a);
}

static bool fast_math(const kiln_compile_opts *o)
{
	return o && o->cuda_math && !strcmp(o->cuda_math, "fast");
}

static kiln_status write_library(cg_session *s, const char *path, kiln_error *err);

static kiln_status write_cuda(cg_session *s, const char *stage, const char *path,
                              kiln_error *err)
{
	if (!strcmp(stage, "cu"))
		return rt_write_atomic(path, s->text, strlen(s->text), err);
	if (!strcmp(stage, "ptx") || !strcmp(stage, "cubin")) {
		char arch[16];
		first_arch(s->lib->o, arch, sizeof arch);
		void *img = NULL;
		size_t n = 0;
		bool ptx = !strcmp(stage, "ptx");
		kiln_status st = cg_nvrtc_compile(s->text, "kiln.cu", arch, ptx, false,
		                                  fast_math(s->lib->o), &img, &n, err);
		if (st == KILN_OK)
			st = rt_write_atomic(path, img, ptx && n ? n - 1 : n, err);
		free(img);
		return st;
	}
	return write_library(s, path, err);
}

/* ---- the emulated library ------------------------------------------------------ */

static const int buf_kinds[] = {[CG_BUF_INPUT] = RT_BUF_INPUT, [CG_BUF_OUTPUT] = RT_BUF_OUTPUT,
                                [CG_BUF_CONST] = RT_BUF_CONST, [CG_BUF_TEMP] = RT_BUF_TEMP,
                                [CG_BUF_STATE] = RT_BUF_STATE};

static void cstring(FILE *f, const char *s)
{
	fputc('"', f);
	for (s = s ? s : ""; *s; s++)
		fprintf(f, *s == '"' || *s == '\\' ? "\\%c" : (unsigned char)*s < 32 ? "?" : "%c", *s);
	fputc('"', f);
}

static void dim_expr(FILE *f, const cg_module *m, const cg_buf *b, int d)
{
	if (b->dim[d])
		cg_cuda_print_expr(f, m, b->dim[d]);
	else
		fprintf(f, "%lldLL", (long long)b->type.dim[d]);
}

static void io_table(FILE *f, const cg_module *m, const char *what, const int *bufs, int n)
{
	for (int i = 0; i < n; i++) {
		const cg_buf *b = &m->buf[bufs[i]];
		fprintf(f, "static const kiln_i64 %s_dims%d[] = {", what, i);
		for (int d = 0; d < b->type.rank; d++) {
			const cg_expr *e = b->dim[d];
			int64_t v = !e ? b->type.dim[d] : e->kind == CG_CONST ? e->i : -1;
			fprintf(f, "%s%lld", d ? ", " : "",
			        (long long)(v >= 0 ? v : e->kind == CG_SIZE ? e->var : 0));
		}
		fprintf(f, "%s};\nstatic const int32_t %s_kinds%d[] = {", b->type.rank ? "" : "0",
		        what, i);
		for (int d = 0; d < b->type.rank; d++) {
			const cg_expr *e = b->dim[d];
			int64_t v = !e ? b->type.dim[d] : e->kind == CG_CONST ? e->i : -1;
			fprintf(f, "%s%d", d ? ", " : "", v >= 0 ? RT_DIM_FIXED
			        : e->kind == CG_SIZE ? RT_DIM_SYM : RT_DIM_EXPR);
		}
		fprintf(f, "%s};\n", b->type.rank ? "" : "0");
	}
	fprintf(f, "static const rt_io_desc kiln_%s[] = {", what);
	for (int i = 0; i < n; i++) {
		const cg_buf *b = &m->buf[bufs[i]];
		fprintf(f, "%s\n\t{", i ? "," : "");
		cstring(f, b->name);
		fprintf(f, ", %d, %d, %s_dims%d, %s_kinds%d, %d, 0}", b->dt, b->type.rank, what, i,
		        what, i, bufs[i]);
	}
	fprintf(f, "%s};\n", n ? "" : "{}");
}

/* m's rt_model_desc as C++: "kiln_model_desc" (exported, what kiln_load
 * reads) when exported, else static "kiln_<tag>_desc"; every table's name
 * has the tag, so a training library describes its two programs in one
 * file.  kernels: the printer's table (<prefix>_kernels); nstate > 0: the
 * STATE buffers index kiln_state. */
static kiln_status describe(FILE *f, const cg_module *m, const char *name, const char *prefix,
                            const char *tag, bool exported, int nstate, cg_blob *bl,
                            kiln_error *err)
{
	char what[64];
	fprintf(f, "\n/* ---- the description of '%s' (runtime/model.h) ---- */\n", tag);
	fprintf(f, "static void kiln_%s_numel(const kiln_i64 *sym, kiln_i64 *n)\n{\n\t(void)sym;\n",
	        tag);
	for (int b = 0; b < m->nbuf; b++) {
		fprintf(f, "\tn[%d] = ", b);
		cg_cuda_print_expr(f, m, m->buf[b].numel);
		fprintf(f, ";\n");
	}
	fprintf(f, "}\nstatic void kiln_%s_io_dims(const kiln_i64 *sym, kiln_i64 *d)\n{\n"
	        "\t(void)sym;\n\t(void)d;\n", tag);
	int k = 0;
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		for (int d = 0; d < m->buf[b].type.rank; d++) {
			fprintf(f, "\td[%d] = ", k++);
			dim_expr(f, m, &m->buf[b], d);
			fprintf(f, ";\n");
		}
	}
	fprintf(f, "}\n");
	snprintf(what, sizeof what, "%s_inputs", tag);
	io_table(f, m, what, m->inputs, m->ninputs);
	snprintf(what, sizeof what, "%s_outputs", tag);
	io_table(f, m, what, m->outputs, m->noutputs);
	fprintf(f, "static const rt_buf_desc kiln_%s_bufs[] = {", tag);
	for (int i = 0; i < m->nbuf; i++) {
		const cg_buf *b = &m->buf[i];
		int slot = b->kind == CG_BUF_STATE ? b->io_index
		           : b->kind == CG_BUF_TEMP && b->alias < 0 ? b->slot : -1;
		fprintf(f, "%s\n\t{%d, %d, %d, %d, ", i ? "," : "", buf_kinds[b->kind], b->dt, slot,
		        b->alias);
		if (b->kind == CG_BUF_CONST && b->alias < 0) {
			if (!b->data || b->data->dtype != b->dt)
				return ir_seterr(err, KILN_EINVAL, "CUDA backend: constant buffer %d has no "
				                 "data of its dtype", i);
			int64_t at = cg_blob_add(bl, b->data->data, kiln_tensor_nbytes(b->data));
			if (at < 0)
				return ir_seterr(err, KILN_ENOMEM, "out of memory laying out weights");
			fprintf(f, CG_BLOB_SYMBOL " + %lld}", (long long)at);
		} else
			fprintf(f, "NULL}");
	}
	fprintf(f, "%s};\nstatic const char *const kiln_%s_kernel_names[] = {",
	        m->nbuf ? "" : "{}", tag);
	for (int i = 0; i < m->nkern; i++) {
		fprintf(f, "%s", i ? ", " : "");
		cstring(f, m->kern[i].name);
	}
	fprintf(f, "%s};\nstatic const char *const kiln_%s_sym_names[] = {", m->nkern ? "" : "NULL",
	        tag);
	for (int i = 0; i < m->nsym; i++) {
		fprintf(f, "%s", i ? ", " : "");
		cstring(f, m->symname ? m->symname[i] : "");
	}
	fprintf(f, "%s};\n", m->nsym ? "" : "NULL");
	if (exported)
		fprintf(f, "extern \"C\" __attribute__((visibility(\"default\"))) const rt_model_desc "
		        "kiln_model_desc = {\n");
	else
		fprintf(f, "static const rt_model_desc kiln_%s_desc = {\n", tag);
	fprintf(f, "\tRT_MODEL_ABI, %d, ", m->nsym);
	cstring(f, name);
	fprintf(f, ", kiln_%s_sym_names, %d, %d, kiln_%s_inputs, kiln_%s_outputs, %d, %d,\n"
	        "\tkiln_%s_bufs, %d, 0, %s_kernels, kiln_%s_kernel_names, kiln_%s_numel,\n"
	        "\tkiln_%s_io_dims, 0, %d, 0, %s};\n", tag, m->ninputs, m->noutputs, tag, tag,
	        m->nbuf, m->nslot, tag, m->nkern, prefix, tag, tag, tag, nstate,
	        nstate ? "kiln_state" : "NULL");
	return KILN_OK;
}

/* A training library's state table, kiln_state: names, shapes, initial
 * bytes in the blob (codegen/llvm_lib.c's layout for the CPU). */
static kiln_status state_table(FILE *f, const cg_train_info *ti, cg_blob *bl, kiln_error *err)
{
	fprintf(f, "\n/* ---- the state table ---- */\n");
	for (int i = 0; i < ti->nstate; i++) {
		const kiln_tensor *t = ti->state_init[i];
		fprintf(f, "static const kiln_i64 kiln_state_dims%d[] = {", i);
		for (int d = 0; d < t->rank; d++)
			fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
		fprintf(f, "%s};\n", t->rank ? "" : "0");
	}
	fprintf(f, "static const rt_state_desc kiln_state[] = {");
	for (int i = 0; i < ti->nstate; i++) {
		const kiln_tensor *t = ti->state_init[i];
		int64_t at = cg_blob_add(bl, t->data, kiln_tensor_nbytes(t));
		if (at < 0)
			return ir_seterr(err, KILN_ENOMEM, "out of memory laying out the state");
		fprintf(f, "%s\n\t{", i ? "," : "");
		cstring(f, ti->state_name[i]);
		fprintf(f, ", %d, %d, kiln_state_dims%d, " CG_BLOB_SYMBOL " + %lld}", t->dtype, t->rank,
		        i, (long long)at);
	}
	fprintf(f, "%s};\n", ti->nstate ? "" : "{}");
	return KILN_OK;
}

/* kiln_train_desc over the step's and the eval program's descriptions. */
static void train_desc(FILE *f, const cg_module *m, const cg_train_info *ti)
{
	fprintf(f, "static const int32_t kiln_next[] = {");
	for (int i = 0; i < m->noutputs; i++)
		fprintf(f, "%s%d", i ? ", " : "", ti->next[i]);
	fprintf(f, "};\nstatic const int32_t kiln_ready[] = {");
	for (int i = 0; i < m->noutputs; i++)
		fprintf(f, "%s%d", i ? ", " : "", ti->ready && ti->split >= 0 ? ti->ready[i] : -1);
	fprintf(f, "};\nextern \"C\" __attribute__((visibility(\"default\"))) const rt_train_desc "
	        "kiln_train_desc = {\n\tRT_MODEL_ABI, %d, &kiln_step_desc, &kiln_model_desc, "
	        "kiln_next, %d, %d, %d, %d,\n\tkiln_ready, %d, 0};\n", ti->accum, ti->lr, ti->t,
	        ti->apply, ti->micro + 1, ti->ready ? ti->split : -1);
}

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

/* Placeholders in a build_library command for the source, the blob
 * object and the temporary output. */
static char SRC_ARG[] = "<src>", OBJ_ARG[] = "<obj>", TMP_ARG[] = "<tmp>";

typedef kiln_status (*source_fn)(FILE *f, cg_session *s, cg_blob *bl, kiln_error *err);

/* Writes source(...) to "<path><suffix>" and its blob to "<path>.blob.o",
 * runs argv (SRC_ARG, OBJ_ARG, TMP_ARG replaced by those files and a
 * temporary beside path) and renames the result onto path.  The source is
 * removed afterwards unless keep_src. */
static kiln_status build_library(cg_session *s, const char *path, const char *suffix,
                                 source_fn source, char **argv, bool keep_src,
                                 kiln_error *err)
{
	char src[4300], obj[4300], tmp[4300];
	if (snprintf(src, sizeof src, "%s%s", path, suffix) >= (int)sizeof src ||
	    snprintf(obj, sizeof obj, "%s.blob.o", path) >= (int)sizeof obj)
		return ir_seterr(err, KILN_EINVAL, "%s: path too long", path);
	cg_blob bl = {0};
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	kiln_status st = source(f, s, &bl, err);
	bool bad = ferror(f) != 0;
	if (fclose(f) != 0 || bad)
		st = st ? st : ir_seterr(err, KILN_ENOMEM, "out of memory");
	if (st == KILN_OK)
		st = rt_write_atomic(src, text, strlen(text), err);
	free(text);
	if (st == KILN_OK)
		st = cg_blob_write_object(&bl, obj, err);
	cg_blob_free(&bl);
	if (st == KILN_OK)
		st = cg_temp_file(path, 0777, tmp, sizeof tmp, err);
	if (st == KILN_OK) {
		for (int i = 0; argv[i]; i++)
			argv[i] = argv[i] == SRC_ARG ? src : argv[i] == OBJ_ARG ? obj
			          : argv[i] == TMP_ARG ? tmp : argv[i];
		st = cg_run_tool(path, argv, err);
		if (st == KILN_OK)
			st = cg_commit_file(tmp, path, err);
		else
			unlink(tmp);
	}
	if (!keep_src)
		unlink(src);
	unlink(obj);
	return st;
}

/* The emulated library's source: the printed kernels (as C++) and their
 * description. */
static kiln_status emu_source(FILE *f, cg_session *s, cg_blob *bl, kiln_error *err)
{
	const cg_library *lib = s->lib;
	char pre[160];
	fputs(s->text, f);
	fprintf(f, "\nextern \"C\" const unsigned char " CG_BLOB_SYMBOL "[] "
	        "__attribute__((visibility(\"hidden\")));\n");
	if (!lib->ti)
		return describe(f, lib->m, lib->name, lib->name, "m", true, 0, bl, err);
	/* a training library: the step, the eval program (kiln_model_desc, what
	 * kiln_load runs), the state both index and kiln_train_desc */
	snprintf(pre, sizeof pre, "%s_eval", lib->name);
	kiln_status st = state_table(f, lib->ti, bl, err);
	if (st == KILN_OK)
		st = describe(f, lib->m, lib->name, lib->name, "step", false, lib->ti->nstate, bl, err);
	if (st == KILN_OK)
		st = describe(f, lib->eval, lib->name, pre, "eval", true, lib->ti->nstate, bl, err);
	if (st == KILN_OK)
		train_desc(f, lib->m, lib->ti);
	return st;
}

static kiln_status write_emu(cg_session *s, const char *stage, const char *path,
                             kiln_error *err)
{
	if (strcmp(stage, "so") != 0)
		return write_cuda(s, stage, path, err);
	char rt[4096];
	kiln_status st = cg_runtime_archive(rt, sizeof rt, err);
	if (st != KILN_OK)
		return st;
	char *argv[] = {"c++", "-std=c++14", "-O1", "-w", "-fPIC", "-fvisibility=hidden", "-shared",
	                "-DKILN_CUDA_EMULATE", "-I" KILN_SOURCE_DIR,
	                "-I" KILN_SOURCE_DIR "/include", "-x", "c++", SRC_ARG, "-x", "none",
	                OBJ_ARG, rt, "-o", TMP_ARG, "-Wl,-z,defs", "-lm", "-lpthread", "-ldl",
	                NULL};
	return build_library(s, path, ".emu.cu", emu_source, argv, false, err);
}

static const char *const cuda_stages[] = {"cu", "ptx", "cubin", NULL};

const cg_backend cg_cuda_backend = {
	.name = "cuda", .stages = cuda_stages, .supports = supports, .open = open_cuda,
	.emit_kernels = emit_kernels, .emit_library = emit_library, .write = write_cuda,
	.close = close_s};

const cg_backend cg_cuda_emu_backend = {
	.name = "cuda-emu", .stages = cuda_stages, .supports = supports, .open = open_emu,
	.emit_kernels = emit_kernels, .emit_library = emit_library, .write = write_emu,
	.close = close_s};

/* ---- the CUDA library ------------------------------------------------------------
 * Host code is generated C compiled with cc (no LLVM needed: it is glue, and
 * the printer already writes the grids and launches as C); the cubins, the
 * PTX and the weights go into the blob object (blob.c) beside it.  libcuda
 * is opened with dlopen at _create, so the library loads anywhere and
 * _create fails with a message where there is no driver. */

static const char host_runtime[] =
"#include <dlfcn.h>\n"
"#include <stdarg.h>\n"
"#include <stdint.h>\n"
"#include <stdio.h>\n"
"#include <stdlib.h>\n"
"#include <string.h>\n"
"typedef int CUresult;\n"
"typedef int CUdevice;\n"
"typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;\n"
"typedef unsigned long long CUdeviceptr;\n"
"typedef struct kiln_img { int major, minor, ptx; uint64_t at, n; } kiln_img;\n"
"struct kiln_host {\n"
"\tvoid *lib;\n"
"\tCUdevice dev;\n"
"\tCUcontext cu;\n"
"\tCUmodule mod;\n"
"\tCUstream st;\n"
"\tCUfunction fns[KILN_NLAUNCH + 1], *fn; /* fn: the running program's, within fns */\n"
"\tCUdeviceptr fault, weights, slot[KILN_NSLOT + 1], io[KILN_NBUF + 1];\n"
"\tsize_t slot_bytes[KILN_NSLOT + 1], io_bytes[KILN_NBUF + 1];\n"
"\tCUdeviceptr state[KILN_NSTATE + 1]; /* a training library's state, device-resident */\n"
"\tlong long steps, micro;\n"
"\tCUresult (*cuInit)(unsigned);\n"
"\tCUresult (*cuDeviceGet)(CUdevice *, int);\n"
"\tCUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);\n"
"\tCUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);\n"
"\tCUresult (*cuDevicePrimaryCtxRelease)(CUdevice);\n"
"\tCUresult (*cuCtxSetCurrent)(CUcontext);\n"
"\tCUresult (*cuModuleLoadData)(CUmodule *, const void *);\n"
"\tCUresult (*cuModuleUnload)(CUmodule);\n"
"\tCUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);\n"
"\tCUresult (*cuMemAlloc)(CUdeviceptr *, size_t);\n"
"\tCUresult (*cuMemFree)(CUdeviceptr);\n"
"\tCUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);\n"
"\tCUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);\n"
"\tCUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);\n"
"\tCUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);\n"
"\tCUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);\n"
"\tCUresult (*cuStreamCreate)(CUstream *, unsigned);\n"
"\tCUresult (*cuStreamDestroy)(CUstream);\n"
"\tCUresult (*cuStreamSynchronize)(CUstream);\n"
"\tCUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,\n"
"\t                           unsigned, unsigned, CUstream, void **, void **);\n"
"\tCUresult (*cuGetErrorString)(CUresult, const char **);\n"
"\tchar err[600];\n"
"};\n"
"static int kiln_fail(kiln_host *h, int code, const char *fmt, ...)\n"
"{\n"
"\tva_list ap;\n"
"\tva_start(ap, fmt);\n"
"\tvsnprintf(h->err, sizeof h->err, fmt, ap);\n"
"\tva_end(ap);\n"
"\treturn code;\n"
"}\n"
"/* a driver call that failed: KILN_EIO (6), naming the call and the error */\n"
"static int kiln_cu(kiln_host *h, CUresult r, const char *what)\n"
"{\n"
"\tconst char *s = NULL;\n"
"\tif (r == 0) return 0;\n"
"\tif (h->cuGetErrorString) h->cuGetErrorString(r, &s);\n"
"\treturn kiln_fail(h, 6, \"CUDA: %s failed: error %d (%s)\", what, r, s ? s : \"?\");\n"
"}\n"
"static void *kiln_host_fault(kiln_host *h) { return &h->fault; }\n"
"static int kiln_host_launch(kiln_host *h, int fn, const unsigned g[3], unsigned threads, void **args)\n"
"{\n"
"\treturn kiln_cu(h, h->cuLaunchKernel(h->fn[fn], g[0], g[1], g[2], threads,\n"
"\t                                    threads == 256 ? 1 : threads, 1, 0, h->st, args, NULL),\n"
"\t               \"cuLaunchKernel\");\n"
"}\n"
"static int kiln_sym(kiln_host *h, void **p, const char *name)\n"
"{\n"
"\t*p = dlsym(h->lib, name);\n"
"\treturn *p ? 0 : kiln_fail(h, 3, \"libcuda.so.1 has no %s: the NVIDIA driver is too old\", name);\n"
"}\n"
"#define KILN_SYM(f, name) kiln_sym(h, (void **)&h->f, name)\n"
"static int kiln_open(kiln_host *h)\n"
"{\n"
"\th->lib = dlopen(\"libcuda.so.1\", RTLD_NOW | RTLD_LOCAL);\n"
"\tif (!h->lib) {\n"
"\t\tconst char *e = dlerror();\n"
"\t\treturn kiln_fail(h, 3, \"libcuda.so.1 not found: %s (this library needs an NVIDIA GPU \"\n"
"\t\t                 \"and its driver)\", e ? e : \"dlopen failed\");\n"
"\t}\n"
"\tint rc = KILN_SYM(cuInit, \"cuInit\") || KILN_SYM(cuDeviceGet, \"cuDeviceGet\") ||\n"
"\t         KILN_SYM(cuDeviceGetAttribute, \"cuDeviceGetAttribute\") ||\n"
"\t         KILN_SYM(cuDevicePrimaryCtxRetain, \"cuDevicePrimaryCtxRetain\") ||\n"
"\t         KILN_SYM(cuDevicePrimaryCtxRelease, \"cuDevicePrimaryCtxRelease_v2\") ||\n"
"\t         KILN_SYM(cuCtxSetCurrent, \"cuCtxSetCurrent\") ||\n"
"\t         KILN_SYM(cuModuleLoadData, \"cuModuleLoadData\") ||\n"
"\t         KILN_SYM(cuModuleUnload, \"cuModuleUnload\") ||\n"
"\t         KILN_SYM(cuModuleGetFunction, \"cuModuleGetFunction\") ||\n"
"\t         KILN_SYM(cuMemAlloc, \"cuMemAlloc_v2\") || KILN_SYM(cuMemFree, \"cuMemFree_v2\") ||\n"
"\t         KILN_SYM(cuMemcpyHtoD, \"cuMemcpyHtoD_v2\") ||\n"
"\t         KILN_SYM(cuMemcpyHtoDAsync, \"cuMemcpyHtoDAsync_v2\") ||\n"
"\t         KILN_SYM(cuMemcpyDtoHAsync, \"cuMemcpyDtoHAsync_v2\") ||\n"
"\t         KILN_SYM(cuMemcpyDtoDAsync, \"cuMemcpyDtoDAsync_v2\") ||\n"
"\t         KILN_SYM(cuMemsetD8Async, \"cuMemsetD8Async\") ||\n"
"\t         KILN_SYM(cuStreamCreate, \"cuStreamCreate\") ||\n"
"\t         KILN_SYM(cuStreamDestroy, \"cuStreamDestroy_v2\") ||\n"
"\t         KILN_SYM(cuStreamSynchronize, \"cuStreamSynchronize\") ||\n"
"\t         KILN_SYM(cuLaunchKernel, \"cuLaunchKernel\") ||\n"
"\t         KILN_SYM(cuGetErrorString, \"cuGetErrorString\");\n"
"\tif (rc) return rc;\n"
"\tint major = 0, minor = 0;\n"
"\tif ((rc = kiln_cu(h, h->cuInit(0), \"cuInit\")) ||\n"
"\t    (rc = kiln_cu(h, h->cuDeviceGet(&h->dev, 0), \"cuDeviceGet(0)\")) ||\n"
"\t    (rc = kiln_cu(h, h->cuDeviceGetAttribute(&major, 75, h->dev), \"cuDeviceGetAttribute\")) ||\n"
"\t    (rc = kiln_cu(h, h->cuDeviceGetAttribute(&minor, 76, h->dev), \"cuDeviceGetAttribute\")) ||\n"
"\t    (rc = kiln_cu(h, h->cuDevicePrimaryCtxRetain(&h->cu, h->dev), \"cuDevicePrimaryCtxRetain\")))\n"
"\t\treturn rc;\n"
"\tif ((rc = kiln_cu(h, h->cuCtxSetCurrent(h->cu), \"cuCtxSetCurrent\"))) return rc;\n"
"\t/* a cubin of the device's major version and a minor at most its own, else PTX */\n"
"\tconst kiln_img *best = NULL;\n"
"\tfor (int i = 0; i < KILN_NIMG; i++) {\n"
"\t\tconst kiln_img *m = &kiln_imgs[i];\n"
"\t\tbool fits = m->ptx ? m->major * 10 + m->minor <= major * 10 + minor\n"
"\t\t                   : m->major == major && m->minor <= minor;\n"
"\t\tif (fits && (!best || (best->ptx && !m->ptx) || (best->ptx == m->ptx && m->minor > best->minor)))\n"
"\t\t\tbest = m;\n"
"\t}\n"
"\tif (!best)\n"
"\t\treturn kiln_fail(h, 3, \"this library has no code for the GPU's sm_%d%d (compiled for %s)\",\n"
"\t\t                 major, minor, KILN_ARCHS);\n"
"\tif ((rc = kiln_cu(h, h->cuModuleLoadData(&h->mod, kiln_blob + best->at), \"cuModuleLoadData\")))\n"
"\t\treturn rc;\n"
"\t/* every program's launches, one after the other in fns */\n"
"\tfor (int p = 0, at = 0; p < 2; at += kiln_nls[p++])\n"
"\t\tfor (int i = 0; i < kiln_nls[p]; i++)\n"
"\t\t\tif ((rc = kiln_cu(h, h->cuModuleGetFunction(&h->fns[at + i], h->mod, kiln_lnames[p][i]),\n"
"\t\t\t                  \"cuModuleGetFunction\")))\n"
"\t\t\t\treturn rc;\n"
"\th->fn = h->fns;\n"
"\tif ((rc = kiln_cu(h, h->cuStreamCreate(&h->st, 1), \"cuStreamCreate\")) ||\n"
"\t    (rc = kiln_cu(h, h->cuMemAlloc(&h->fault, 64), \"cuMemAlloc\")))\n"
"\t\treturn rc;\n"
"\tif (KILN_WEIGHT_BYTES &&\n"
"\t    ((rc = kiln_cu(h, h->cuMemAlloc(&h->weights, KILN_WEIGHT_BYTES), \"cuMemAlloc (weights)\")) ||\n"
"\t     (rc = kiln_cu(h, h->cuMemcpyHtoD(h->weights, kiln_blob + KILN_WEIGHT_AT, KILN_WEIGHT_BYTES),\n"
"\t                   \"cuMemcpyHtoD (weights)\"))))\n"
"\t\treturn rc;\n"
"\t/* the training state: allocated once, uploaded from its initial values */\n"
"\tfor (int i = 0; i < KILN_NSTATE; i++)\n"
"\t\tif ((rc = kiln_cu(h, h->cuMemAlloc(&h->state[i], kiln_state_bytes[i] ? kiln_state_bytes[i] : 1),\n"
"\t\t                  \"cuMemAlloc (state)\")) ||\n"
"\t\t    (kiln_state_bytes[i] && (rc = kiln_cu(h, h->cuMemcpyHtoD(h->state[i], kiln_blob + kiln_state_at[i],\n"
"\t\t                                                          kiln_state_bytes[i]), \"cuMemcpyHtoD (state)\"))))\n"
"\t\t\treturn rc;\n"
"\treturn 0;\n"
"}\n"
"static void kiln_close(kiln_host *h)\n"
"{\n"
"\tif (h->cu && h->cuCtxSetCurrent) h->cuCtxSetCurrent(h->cu);\n"
"\tfor (int i = 0; i < KILN_NSLOT; i++) if (h->slot[i]) h->cuMemFree(h->slot[i]);\n"
"\tfor (int i = 0; i < KILN_NBUF; i++) if (h->io[i]) h->cuMemFree(h->io[i]);\n"
"\tfor (int i = 0; i < KILN_NSTATE; i++) if (h->state[i]) h->cuMemFree(h->state[i]);\n"
"\tif (h->weights) h->cuMemFree(h->weights);\n"
"\tif (h->fault) h->cuMemFree(h->fault);\n"
"\tif (h->st) h->cuStreamDestroy(h->st);\n"
"\tif (h->mod) h->cuModuleUnload(h->mod);\n"
"\tif (h->cu) h->cuDevicePrimaryCtxRelease(h->dev);\n"
"\tif (h->lib) dlclose(h->lib);\n"
"}\n"
"/* device memory of n bytes at *p, grown (never shrunk) to fit */\n"
"static int kiln_fit(kiln_host *h, CUdeviceptr *p, size_t *have, size_t n)\n"
"{\n"
"\tif (n <= *have && *p) return 0;\n"
"\tif (*p) h->cuMemFree(*p), *p = 0, *have = 0;\n"
"\tint rc = kiln_cu(h, h->cuMemAlloc(p, n ? n : 1), \"cuMemAlloc\");\n"
"\tif (!rc) *have = n;\n"
"\treturn rc;\n"
"}\n";

static const char *host_ctype(kiln_dtype dt)
{
	switch (dt) {
	case KILN_F32: return "float";
	case KILN_F64: return "double";
	case KILN_I8: return "int8_t";
	case KILN_U8: case KILN_BOOL: return "uint8_t";
	case KILN_I32: return "int32_t";
	case KILN_I64: return "int64_t";
	default: return "uint16_t";
	}
}

static void host_params(FILE *f, const cg_module *m, const char *name, const char *suffix)
{
	fprintf(f, "__attribute__((visibility(\"default\"))) int %s_%s(struct %s_ctx *ctx", name,
	        suffix, name);
	for (int k = 0; k < m->nsym; k++)
		fprintf(f, ", int64_t s%d", k);
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		fprintf(f, ", %s%s *p%d", i < m->ninputs ? "const " : "", host_ctype(m->buf[b].dt), i);
	}
	fprintf(f, ")");
}

/* What every CUDA library has: its context (the host state), _create_ex,
 * _create, _destroy, _errmsg, _set_threads (nothing to set) and kiln_exec,
 * which runs one program (struct kiln_prog): buffers bound (inputs copied
 * in, async), kernels launched, outputs below keep copied out, the fault
 * read.  Outputs from keep on stay in the program's device staging
 * (h->io[b]): a train step's "<p>.next" results until they are committed. */
static void host_common(FILE *f, const char *name)
{
	fprintf(f, "struct %s_ctx { kiln_host h; };\n", name);
	fprintf(f, "__attribute__((visibility(\"default\"))) int %s_create_ex(struct %s_ctx **out, "
	        "char *msg, size_t size)\n{\n\t*out = NULL;\n"
	        "\tstruct %s_ctx *c = calloc(1, sizeof *c);\n"
	        "\tif (!c) {\n\t\tif (msg && size) snprintf(msg, size, \"out of memory\");\n"
	        "\t\treturn 5;\n\t}\n\tint rc = kiln_open(&c->h);\n\tif (rc) {\n"
	        "\t\tif (msg && size) snprintf(msg, size, \"%%s\", c->h.err);\n"
	        "\t\tkiln_close(&c->h);\n\t\tfree(c);\n\t\treturn rc;\n\t}\n"
	        "\t*out = c;\n\treturn 0;\n}\n", name, name, name);
	fprintf(f, "__attribute__((visibility(\"default\"))) struct %s_ctx *%s_create(void)\n{\n"
	        "\tstruct %s_ctx *c = NULL;\n\t%s_create_ex(&c, NULL, 0);\n\treturn c;\n}\n",
	        name, name, name, name);
	fprintf(f, "__attribute__((visibility(\"default\"))) void %s_destroy(struct %s_ctx *c)\n{\n"
	        "\tif (!c) return;\n\tkiln_close(&c->h);\n\tfree(c);\n}\n", name, name);
	fprintf(f, "__attribute__((visibility(\"default\"))) const char *%s_errmsg(const struct "
	        "%s_ctx *c)\n{\n\treturn c ? c->h.err : \"null context\";\n}\n", name, name);
	fprintf(f, "__attribute__((visibility(\"default\"))) int %s_set_threads(struct %s_ctx *c, "
	        "int n)\n{\n\t(void)n;\n\treturn c ? 0 : 1;\n}\n", name, name);
	fputs("static int kiln_exec(kiln_host *h, const struct kiln_prog *P, const kiln_i64 *sym,\n"
	      "                     void *const *io, int dev, int keep)\n"
	      "{\n\tkiln_i64 n[KILN_NBUF + 1];\n\tkiln_u64 buf[KILN_NBUF + 1];\n"
	      "\tsize_t need[KILN_NSLOT + 1] = {0};\n\tint rc;\n\tP->numel(sym, n);\n"
	      "\th->fn = h->fns + P->fn;\n"
	      "\tif ((rc = kiln_cu(h, h->cuCtxSetCurrent(h->cu), \"cuCtxSetCurrent\"))) return rc;\n"
	      "\tfor (int b = 0; b < P->nbuf; b++)\n"
	      "\t\tif (P->bufs[b].slot >= 0 && need[P->bufs[b].slot] < (size_t)n[b] * P->bufs[b].size)\n"
	      "\t\t\tneed[P->bufs[b].slot] = (size_t)n[b] * P->bufs[b].size;\n"
	      "\tfor (int s = 0; s < KILN_NSLOT; s++)\n"
	      "\t\tif ((rc = kiln_fit(h, &h->slot[s], &h->slot_bytes[s], need[s]))) return rc;\n"
	      "\tfor (int b = 0; b < P->nbuf; b++) {\n"
	      "\t\tconst struct kiln_bufd *d = &P->bufs[b];\n"
	      "\t\tsize_t bytes = (size_t)n[b] * d->size;\n"
	      "\t\tif (d->io >= 0 && dev) buf[b] = (kiln_u64)(uintptr_t)io[d->io];\n"
	      "\t\telse if (d->io >= 0) {\n"
	      "\t\t\tif ((rc = kiln_fit(h, &h->io[b], &h->io_bytes[b], bytes))) return rc;\n"
	      "\t\t\tbuf[b] = h->io[b];\n"
	      "\t\t\tif (d->io < P->ninputs && bytes && (rc = kiln_cu(h, h->cuMemcpyHtoDAsync(buf[b], io[d->io], bytes, h->st), \"cuMemcpyHtoDAsync\"))) return rc;\n"
	      "\t\t} else if (d->weight >= 0) buf[b] = h->weights + (kiln_u64)d->weight;\n"
	      "\t\telse if (d->state >= 0) buf[b] = h->state[d->state];\n"
	      "\t\telse if (d->slot >= 0) buf[b] = h->slot[d->slot];\n"
	      "\t\telse buf[b] = 0;\n\t}\n"
	      "\tfor (int b = 0; b < P->nbuf; b++)\n"
	      "\t\tif (P->bufs[b].alias >= 0) buf[b] = buf[P->bufs[b].alias];\n"
	      "\tif ((rc = kiln_cu(h, h->cuMemsetD8Async(h->fault, 0, 64, h->st), \"cuMemsetD8Async\"))) return rc;\n"
	      "\tfor (int k = 0; k < P->nkern; k++)\n"
	      "\t\tif ((rc = P->launches[k](h, sym, buf))) return rc;\n"
	      "\tstruct { int set, id; kiln_i64 v, lo, hi; } fault;\n"
	      "\tif ((rc = kiln_cu(h, h->cuMemcpyDtoHAsync(&fault, h->fault, sizeof fault, h->st), \"cuMemcpyDtoHAsync\"))) return rc;\n"
	      "\tfor (int b = 0; b < P->nbuf && !dev; b++) {\n"
	      "\t\tconst struct kiln_bufd *d = &P->bufs[b];\n"
	      "\t\tif (d->io >= P->ninputs && d->io < P->ninputs + keep && n[b] &&\n"
	      "\t\t    (rc = kiln_cu(h, h->cuMemcpyDtoHAsync(io[d->io], buf[b], (size_t)n[b] * d->size, h->st), \"cuMemcpyDtoHAsync\"))) return rc;\n"
	      "\t}\n"
	      "\tif ((rc = kiln_cu(h, h->cuStreamSynchronize(h->st), \"cuStreamSynchronize\"))) return rc;\n"
	      "\tif (fault.set && fault.lo < fault.hi)\n"
	      "\t\treturn kiln_fail(h, 1, \"%s %lld out of range [%lld, %lld)\", P->what[fault.id], "
	      "(long long)fault.v, (long long)fault.lo, (long long)fault.hi);\n"
	      "\tif (fault.set) return kiln_fail(h, 1, \"%s\", P->what[fault.id]);\n"
	      "\th->err[0] = 0;\n\treturn 0;\n}\n", f);
}

/* int <name>_<suffix>(ctx, syms..., inputs..., outputs...): program p of
 * kiln_progs on host arrays (dev 0: copied in and out) or device pointers
 * (dev 1), after checking the sizes and pointers. */
static void host_run(FILE *f, const cg_module *m, const char *name, const char *suffix, int p,
                     int dev)
{
	host_params(f, m, name, suffix);
	fprintf(f, "\n{\n\tif (!c_ok(ctx)) return 1;\n\tkiln_i64 sym[%d] = {0", m->nsym + 1);
	for (int k = 0; k < m->nsym; k++)
		fprintf(f, ", s%d", k);
	fprintf(f, "};\n\tvoid *io[%d] = {0", m->ninputs + m->noutputs + 1);
	for (int i = 0; i < m->ninputs + m->noutputs; i++)
		fprintf(f, ", (void *)p%d", i);
	fprintf(f, "};\n");
	for (int k = 0; k < m->nsym; k++)
		fprintf(f, "\tif (s%d < 0) return kiln_fail(&ctx->h, 1, \"size %d is negative\");\n", k, k);
	for (int i = 0; i < m->ninputs + m->noutputs; i++)
		fprintf(f, "\tif (!p%d) return kiln_fail(&ctx->h, 1, \"argument %d is NULL\");\n", i, i);
	fprintf(f, "\treturn kiln_exec(&ctx->h, &kiln_progs[%d], sym + 1, io + 1, %d, %d);\n}\n", p,
	        dev, m->noutputs);
}

/* An inference library's _run (host pointers: async copies in and out) and
 * _run_device (device pointers, nothing copied). */
static void host_run_entries(FILE *f, const cg_module *m, const char *name)
{
	for (int dev = 0; dev < 2; dev++)
		host_run(f, m, name, dev ? "run_device" : "run", 0, dev);
}

/* A training library's entry points, the CPU library's shape (model.h of
 * kiln_compile_train) with the state on the device:
 *   _train_step(ctx, syms..., data inputs..., double lr, T *loss): the step
 *     program with lr, step = steps + 1, apply and __micro__ fed here as
 *     model_train.c feeds them, the loss copied back; then, only when the
 *     run succeeded, every "<p>.next" result copied over its state tensor
 *     on the device and the counters advanced;
 *   _eval_step(ctx, syms..., inputs..., outputs...): the eval program on
 *     the current state (host arrays, as _run);
 *   _steps, _micro, _set_counters, _num_state, _state_name, _state_bytes,
 *   _get_state and _set_state (one tensor, device <-> host, synchronous):
 *     what a checkpoint needs. */
static void train_entries(FILE *f, const cg_library *lib)
{
	const cg_module *m = lib->m, *e = lib->eval;
	const cg_train_info *ti = lib->ti;
	const char *name = lib->name;
	const char *vis = "__attribute__((visibility(\"default\")))";
	fprintf(f, "%s int %s_train_step(struct %s_ctx *ctx", vis, name, name);
	for (int k = 0; k < m->nsym; k++)
		fprintf(f, ", int64_t s%d", k);
	for (int i = 0; i < m->ninputs; i++)
		if (i != ti->lr && i != ti->t && i != ti->apply && i != ti->micro)
			fprintf(f, ", const %s *p%d", host_ctype(m->buf[m->inputs[i]].dt), i);
	fprintf(f, ", double lr, %s *loss)\n{\n\tif (!c_ok(ctx)) return 1;\n"
	        "\tkiln_host *h = &ctx->h;\n\tkiln_i64 sym[%d] = {0", host_ctype(m->buf[m->outputs[0]].dt),
	        m->nsym + 1);
	for (int k = 0; k < m->nsym; k++)
		fprintf(f, ", s%d", k);
	fprintf(f, "};\n\tdouble lr_in = lr, t_in = (double)(h->steps + 1);\n"
	        "\tkiln_i64 micro_in = h->micro;\n"
	        "\tunsigned char apply_in = (unsigned char)((h->micro + 1) %% %d == 0);\n"
	        "\t(void)lr_in, (void)t_in, (void)micro_in;\n"
	        "\tvoid *io[%d] = {0", ti->accum, m->ninputs + m->noutputs + 1);
	for (int i = 0; i < m->ninputs; i++)
		fprintf(f, ", %s", i == ti->lr ? "&lr_in" : i == ti->t ? "&t_in"
		        : i == ti->apply ? "&apply_in" : i == ti->micro ? "&micro_in" : "0");
	fprintf(f, ", loss};\n");
	for (int i = 0; i < m->ninputs; i++)
		if (i != ti->lr && i != ti->t && i != ti->apply && i != ti->micro)
			fprintf(f, "\tio[%d] = (void *)p%d;\n\tif (!p%d) return kiln_fail(h, 1, "
			        "\"train_step: input %d is NULL\");\n", i + 1, i, i, i);
	for (int k = 0; k < m->nsym; k++)
		fprintf(f, "\tif (s%d < 0) return kiln_fail(h, 1, \"size %d is negative\");\n", k, k);
	fprintf(f, "\tif (!loss) return kiln_fail(h, 1, \"train_step: loss is NULL\");\n"
	        "\tint rc = kiln_exec(h, &kiln_progs[0], sym + 1, io + 1, 0, 1);\n"
	        "\tif (rc) return rc;\n"
	        "\t/* the run succeeded: commit every .next over its state tensor */\n"
	        "\tkiln_i64 n[KILN_NBUF + 1];\n\tkiln_progs[0].numel(sym + 1, n);\n");
	for (int i = 1; i < m->noutputs; i++) {
		int b = m->outputs[i];
		if (ti->next[i] >= 0)
			fprintf(f, "\tif ((rc = kiln_cu(h, h->cuMemcpyDtoDAsync(h->state[%d], h->io[%d], "
			        "(size_t)n[%d] * %zu, h->st), \"cuMemcpyDtoDAsync (state)\"))) return rc;\n",
			        ti->next[i], b, b, kiln_dtype_size(m->buf[b].dt));
	}
	fprintf(f, "\tif ((rc = kiln_cu(h, h->cuStreamSynchronize(h->st), \"cuStreamSynchronize\"))) "
	        "return rc;\n\th->steps += apply_in;\n\th->micro++;\n\treturn 0;\n}\n");
	host_run(f, e, name, "eval_step", 1, 0);
	fprintf(f, "%s int64_t %s_steps(const struct %s_ctx *c) { return c ? c->h.steps : -1; }\n"
	        "%s int64_t %s_micro(const struct %s_ctx *c) { return c ? c->h.micro : -1; }\n"
	        "%s int %s_set_counters(struct %s_ctx *c, int64_t steps, int64_t micro)\n{\n"
	        "\tif (!c) return 1;\n\tif (steps < 0 || micro < steps)\n"
	        "\t\treturn kiln_fail(&c->h, 1, \"counters %%lld steps, %%lld micro-batches: not 0 <= "
	        "steps <= micro\", (long long)steps, (long long)micro);\n"
	        "\tc->h.steps = steps, c->h.micro = micro;\n\treturn 0;\n}\n"
	        "%s int %s_num_state(void) { return KILN_NSTATE; }\n"
	        "%s const char *%s_state_name(int i) { return i >= 0 && i < KILN_NSTATE ? "
	        "kiln_state_names[i] : NULL; }\n"
	        "%s int64_t %s_state_bytes(int i) { return i >= 0 && i < KILN_NSTATE ? "
	        "(int64_t)kiln_state_bytes[i] : -1; }\n",
	        vis, name, name, vis, name, name, vis, name, name, vis, name, vis, name, vis, name);
	for (int set = 0; set < 2; set++)
		fprintf(f, "%s int %s_%s_state(struct %s_ctx *c, int i, %svoid *host)\n{\n"
		        "\tif (!c) return 1;\n\tkiln_host *h = &c->h;\n"
		        "\tif (i < 0 || i >= KILN_NSTATE || !host)\n"
		        "\t\treturn kiln_fail(h, 1, \"%s_state: no state tensor %%d (%%d of them) or a NULL "
		        "array\", i, KILN_NSTATE);\n\tint rc;\n"
		        "\tif ((rc = kiln_cu(h, h->cuCtxSetCurrent(h->cu), \"cuCtxSetCurrent\"))) return rc;\n"
		        "\tif ((rc = kiln_cu(h, %s, \"%s\"))) return rc;\n"
		        "\treturn kiln_cu(h, h->cuStreamSynchronize(h->st), \"cuStreamSynchronize\");\n}\n",
		        vis, name, set ? "set" : "get", name, set ? "const " : "", set ? "set" : "get",
		        set ? "h->cuMemcpyHtoDAsync(h->state[i], host, kiln_state_bytes[i], h->st)"
		            : "h->cuMemcpyDtoHAsync(host, h->state[i], kiln_state_bytes[i], h->st)",
		        set ? "cuMemcpyHtoDAsync (state)" : "cuMemcpyDtoHAsync (state)");
}

/* Program p's buffer table and element counts (kiln_bufs<p>, kiln_numel<p>):
 * per buffer its io position (inputs then outputs), scratch slot, alias,
 * offset in the device weights, state row and element size. */
static void host_prog_tables(FILE *f, const cg_module *m, int p, const int64_t *woff,
                             int64_t wfirst)
{
	fprintf(f, "static const struct kiln_bufd kiln_bufs%d[] = {", p);
	for (int b = 0; b < m->nbuf; b++) {
		const cg_buf *cb = &m->buf[b];
		int io = cb->kind == CG_BUF_INPUT ? cb->io_index
		         : cb->kind == CG_BUF_OUTPUT ? m->ninputs + cb->io_index : -1;
		int slot = cb->kind == CG_BUF_TEMP && cb->alias < 0 ? cb->slot : -1;
		int state = cb->kind == CG_BUF_STATE && cb->alias < 0 ? cb->io_index : -1;
		fprintf(f, "%s\n\t{%d, %d, %d, %d, %lld, %zu}", b ? "," : "", cb->alias >= 0 ? -1 : io,
		        slot, cb->alias, state, (long long)(woff[b] < 0 ? -1 : woff[b] - wfirst),
		        kiln_dtype_size(cb->dt));
	}
	fprintf(f, "%s};\n", m->nbuf ? "" : "{-1, -1, -1, -1, -1, 0}");
	fprintf(f, "static void kiln_numel%d(const kiln_i64 *sym, kiln_i64 *n)\n{\n\t(void)sym;\n", p);
	for (int b = 0; b < m->nbuf; b++) {
		fprintf(f, "\tn[%d] = ", b);
		cg_cuda_print_expr(f, m, m->buf[b].numel);
		fprintf(f, ";\n");
	}
	fprintf(f, "}\n");
}

/* The weights of m (its constant buffers) appended to the blob: their
 * offsets into woff (-1: not a weight), the run they span into *wfirst and
 * *wend. */
static kiln_status host_weights(const cg_module *m, cg_blob *bl, int64_t *woff, int64_t *wfirst,
                                uint64_t *wend, kiln_error *err)
{
	for (int b = 0; b < m->nbuf; b++) {
		const cg_buf *cb = &m->buf[b];
		woff[b] = -1;
		if (cb->kind != CG_BUF_CONST || cb->alias >= 0)
			continue;
		if (!cb->data || cb->data->dtype != cb->dt)
			return ir_seterr(err, KILN_EINVAL, "CUDA backend: constant buffer %d has no data of "
			                 "its dtype", b);
		/* appended, never shared with an image: 64-byte aligned after them */
		int64_t at = cg_blob_add(bl, cb->data->data, kiln_tensor_nbytes(cb->data));
		if (at < 0)
			return ir_seterr(err, KILN_ENOMEM, "out of memory");
		if (*wfirst < 0 || at < *wfirst)
			*wfirst = at;
		woff[b] = at;
		if ((uint64_t)at + kiln_tensor_nbytes(cb->data) > *wend)
			*wend = (uint64_t)at + kiln_tensor_nbytes(cb->data);
	}
	return KILN_OK;
}

/* A train step's "<p>.next" outputs are committed from their device
 * staging (h->io[b]): each must be a buffer of its own. */
static kiln_status check_train_outputs(const cg_library *lib, kiln_error *err)
{
	for (int i = 1; lib->ti && i < lib->m->noutputs; i++)
		if (lib->ti->next[i] >= 0 && lib->m->buf[lib->m->outputs[i]].alias >= 0)
			return ir_seterr(err, KILN_EUNSUPPORTED, "CUDA backend: train step output %d ('%s') "
			                 "shares another buffer's memory", i,
			                 lib->m->buf[lib->m->outputs[i]].name ? lib->m->buf[lib->m->outputs[i]].name : "?");
	return KILN_OK;
}

static kiln_status host_source(FILE *f, cg_session *s, cg_blob *bl, const char *archs,
                               kiln_error *err)
{
	const cg_library *lib = s->lib;
	const char *name = lib->name;
	int nprog = lib->eval ? 2 : 1;
	const cg_module *prog[2] = {lib->m, lib->eval};
	kiln_status st = check_train_outputs(lib, err);
	if (st != KILN_OK)
		return st;
	/* the images first: cubin per architecture, PTX for the last */
	int nimg = 0;
	char imgs[2048] = "";
	size_t used = 0;
	const char *a = archs;
	while (*a && st == KILN_OK) {
		size_t n = strcspn(a, ",");
		char arch[16];
		snprintf(arch, sizeof arch, "%.*s", (int)(n < 15 ? n : 15), a);
		a += n + (a[n] == ',');
		for (int ptx = 0; ptx < 2 && st == KILN_OK; ptx++) {
			if (ptx && *a)
				continue; /* PTX only for the last architecture */
			void *img = NULL;
			size_t len = 0;
			st = cg_nvrtc_compile(s->text, "kiln.cu", arch, ptx, false, fast_math(lib->o),
			                      &img, &len, err);
			if (st == KILN_OK && s->nimg == (int)(sizeof s->img / sizeof *s->img)) {
				free(img);
				st = ir_seterr(err, KILN_EINVAL, "--cuda-arch: at most %d architectures",
				               (int)(sizeof s->img / sizeof *s->img) - 1);
				break;
			}
			if (st == KILN_OK)
				s->img[s->nimg++] = img; /* freed with the session, after the blob */
			int64_t at = st == KILN_OK ? cg_blob_add(bl, img, len) : 0;
			if (at < 0)
				st = ir_seterr(err, KILN_ENOMEM, "out of memory");
			int cc = atoi(arch + 3);
			if (st == KILN_OK && used < sizeof imgs)
				used += (size_t)snprintf(imgs + used, sizeof imgs - used, "%s{%d, %d, %d, %lld, %zu}",
				                         nimg ? ", " : "", cc / 10, cc % 10, ptx,
				                         (long long)at, len);
			nimg++;
		}
	}
	if (st != KILN_OK)
		return st;
	/* weights of every program: one contiguous run of the blob, uploaded
	 * once at _create; then the training state's initial values */
	int64_t wfirst = -1, *woff[2] = {NULL, NULL};
	uint64_t wend = 0;
	int nstate = lib->ti ? lib->ti->nstate : 0;
	int64_t *sat = calloc((size_t)nstate + 1, sizeof *sat);
	int nbuf = 0, nslot = 0;
	for (int p = 0; p < nprog && st == KILN_OK; p++) {
		woff[p] = calloc((size_t)prog[p]->nbuf + 1, sizeof *woff[p]);
		st = woff[p] && sat ? host_weights(prog[p], bl, woff[p], &wfirst, &wend, err)
		                    : ir_seterr(err, KILN_ENOMEM, "out of memory");
		nbuf = prog[p]->nbuf > nbuf ? prog[p]->nbuf : nbuf;
		nslot = prog[p]->nslot > nslot ? prog[p]->nslot : nslot;
	}
	for (int i = 0; i < nstate && st == KILN_OK; i++) {
		const kiln_tensor *t = lib->ti->state_init[i];
		if ((sat[i] = cg_blob_add(bl, t->data, kiln_tensor_nbytes(t))) < 0)
			st = ir_seterr(err, KILN_ENOMEM, "out of memory");
	}
	if (st == KILN_OK) {
		fprintf(f, "#define KILN_CUDA_HOST 1\n#define KILN_NBUF %d\n#define KILN_NSLOT %d\n"
		        "#define KILN_NSTATE %d\n#define KILN_NIMG %d\n#define KILN_ARCHS \"%s\"\n"
		        "#define KILN_WEIGHT_AT %lldULL\n#define KILN_WEIGHT_BYTES %lluULL\n", nbuf, nslot,
		        nstate, nimg, archs, (long long)(wfirst < 0 ? 0 : wfirst),
		        (unsigned long long)(wfirst < 0 ? 0 : wend - (uint64_t)wfirst));
		fprintf(f, "#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n"
		        "extern const unsigned char " CG_BLOB_SYMBOL "[] __attribute__((visibility(\"hidden\")));\n");
		fprintf(f, "%.*s", (int)(strstr(host_runtime, "typedef struct kiln_img") - host_runtime),
		        host_runtime);
		/* the grids, launches and tables, under KILN_CUDA_HOST, program by
		 * program: each text defines its own KILN_NLAUNCH */
		for (int p = 0; p < 2; p++) {
			size_t from = p ? s->eval_at : 0, to = p || !s->eval_at ? strlen(s->text) : s->eval_at;
			if (p < nprog)
				fprintf(f, "%.*s\nenum { kiln_nl%d = KILN_NLAUNCH };\n#undef KILN_NLAUNCH\n",
				        (int)(to - from), s->text + from, p);
			else
				fprintf(f, "enum { kiln_nl%d = 0 };\n", p);
		}
		fprintf(f, "#define KILN_NLAUNCH (kiln_nl0 + kiln_nl1)\n"
		        "static const int kiln_nls[2] = {kiln_nl0, kiln_nl1};\n"
		        "static const char *const *const kiln_lnames[2] = {%s_launch_names, ", name);
		if (nprog > 1)
			fprintf(f, "%s_eval_launch_names};\n", name);
		else
			fprintf(f, "NULL};\n");
		fprintf(f, "typedef struct kiln_img { int major, minor, ptx; uint64_t at, n; } kiln_img;\n"
		        "static const kiln_img kiln_imgs[] = {%s};\n", imgs);
		fprintf(f, "static const unsigned long long kiln_state_at[] = {");
		for (int i = 0; i < nstate; i++)
			fprintf(f, "%s%lldULL", i ? ", " : "", (long long)sat[i]);
		fprintf(f, "%s};\nstatic const size_t kiln_state_bytes[] = {", nstate ? "" : "0");
		for (int i = 0; i < nstate; i++)
			fprintf(f, "%s%zu", i ? ", " : "", kiln_tensor_nbytes(lib->ti->state_init[i]));
		fprintf(f, "%s};\nstatic const char *const kiln_state_names[] = {", nstate ? "" : "0");
		for (int i = 0; i < nstate; i++) {
			fprintf(f, "%s", i ? ", " : "");
			cstring(f, lib->ti->state_name[i]);
		}
		fprintf(f, "%s};\n", nstate ? "" : "NULL");
		fputs(strstr(host_runtime, "struct kiln_host {"), f);
		fprintf(f, "struct kiln_bufd { int io, slot, alias, state; long long weight; size_t size; };\n"
		        "struct kiln_prog {\n\tconst struct kiln_bufd *bufs;\n"
		        "\tint nbuf, ninputs, nkern, fn; /* fn: its first launch in kiln_host.fns */\n"
		        "\tvoid (*numel)(const kiln_i64 *, kiln_i64 *);\n"
		        "\tint (*const *launches)(kiln_host *, const kiln_i64 *, kiln_u64 *);\n"
		        "\tconst char *const *what;\n};\n");
		for (int p = 0; p < nprog; p++)
			host_prog_tables(f, prog[p], p, woff[p], wfirst);
		fprintf(f, "static const struct kiln_prog kiln_progs[] = {");
		for (int p = 0; p < nprog; p++)
			fprintf(f, "%s\n\t{kiln_bufs%d, %d, %d, %d, %s, kiln_numel%d, %s%s_launches, "
			        "%s%s_what}", p ? "," : "", p, prog[p]->nbuf, prog[p]->ninputs,
			        prog[p]->nkern, p ? "kiln_nl0" : "0", p, name, p ? "_eval" : "", name,
			        p ? "_eval" : "");
		fprintf(f, "};\n");
		fprintf(f, "static bool c_ok(const void *c) { return c != NULL; }\n"
		        "/* what kiln_load looks for to say this is a CUDA library */\n"
		        "__attribute__((visibility(\"default\"))) const int kiln_cuda_library = %d;\n",
		        lib->ti ? 2 : 1);
		host_common(f, name);
		if (lib->ti)
			train_entries(f, lib);
		else
			host_run_entries(f, lib->m, name);
	}
	free(woff[0]), free(woff[1]), free(sat);
	return st;
}

/* The CUDA library's host source, for build_library. */
static kiln_status cuda_source(FILE *f, cg_session *s, cg_blob *bl, kiln_error *err)
{
	const kiln_compile_opts *o = s->lib->o;
	const char *archs = o && o->cuda_arch && *o->cuda_arch ? o->cuda_arch : "sm_80,sm_90";
	return host_source(f, s, bl, archs, err);
}

static kiln_status write_library(cg_session *s, const char *path, kiln_error *err)
{
	char *argv[] = {"cc", "-std=gnu11", "-O2", "-w", "-fPIC", "-fvisibility=hidden", "-shared",
	                "-x", "c", SRC_ARG, "-x", "none", OBJ_ARG, "-o", TMP_ARG, "-Wl,-z,defs",
	                "-Wl,--build-id=none", "-ldl", NULL};
	return build_library(s, path, ".host.c", cuda_source, argv,
	                     getenv("KILN_KEEP_CUDA_HOST") != NULL, err);
}
