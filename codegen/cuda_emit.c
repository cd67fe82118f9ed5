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
	char *text;
};

static bool supports(const cg_module *m, const cg_kernel *k, char *why, size_t size)
{
	return cg_cuda_supports(m, k, why, size);
}

static kiln_status open_s(cg_session **out, const cg_library *lib, bool emu, kiln_error *err)
{
	if (lib->ti || lib->eval)
		return ir_seterr(err, KILN_EUNSUPPORTED, "the CUDA backend does not compile training "
		                 "steps yet (kiln issue #14, part 4)");
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

static kiln_status emit_kernels(cg_session *s, const cg_module *m, kiln_error *err)
{
	s->text = cg_cuda_print(m, &(cg_cuda_opts){.emulate = s->emu, .prefix = s->lib->name});
	return s->text ? KILN_OK : ir_seterr(err, KILN_ENOMEM, "out of memory printing CUDA C");
}

static kiln_status emit_library(cg_session *s, kiln_error *err)
{
	return KILN_OK;
}

static void close_s(cg_session *s)
{
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
	return ir_seterr(err, KILN_EUNSUPPORTED, "the CUDA backend cannot write a library (.so) "
	                 "yet: use --emit=cu, ptx or cubin (kiln issue #14, part 2)");
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

static kiln_status describe(FILE *f, const cg_module *m, const char *name, cg_blob *bl,
                            kiln_error *err)
{
	fprintf(f, "\n/* ---- the description (runtime/model.h) ---- */\n"
	        "extern \"C\" const unsigned char " CG_BLOB_SYMBOL "[] "
	        "__attribute__((visibility(\"hidden\")));\n");
	fprintf(f, "static void kiln_numel(const kiln_i64 *sym, kiln_i64 *n)\n{\n\t(void)sym;\n");
	for (int b = 0; b < m->nbuf; b++) {
		fprintf(f, "\tn[%d] = ", b);
		cg_cuda_print_expr(f, m, m->buf[b].numel);
		fprintf(f, ";\n");
	}
	fprintf(f, "}\nstatic void kiln_io_dims(const kiln_i64 *sym, kiln_i64 *d)\n{\n\t(void)sym;"
	        "\n\t(void)d;\n");
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
	io_table(f, m, "inputs", m->inputs, m->ninputs);
	io_table(f, m, "outputs", m->outputs, m->noutputs);
	fprintf(f, "static const rt_buf_desc kiln_bufs[] = {");
	for (int i = 0; i < m->nbuf; i++) {
		const cg_buf *b = &m->buf[i];
		int slot = b->kind == CG_BUF_TEMP && b->alias < 0 ? b->slot : -1;
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
	fprintf(f, "%s};\nstatic const char *const kiln_kernel_names[] = {", m->nbuf ? "" : "{}");
	for (int i = 0; i < m->nkern; i++) {
		fprintf(f, "%s", i ? ", " : "");
		cstring(f, m->kern[i].name);
	}
	fprintf(f, "%s};\nstatic const char *const kiln_sym_names[] = {", m->nkern ? "" : "NULL");
	for (int i = 0; i < m->nsym; i++) {
		fprintf(f, "%s", i ? ", " : "");
		cstring(f, m->symname ? m->symname[i] : "");
	}
	fprintf(f, "%s};\n", m->nsym ? "" : "NULL");
	fprintf(f, "extern \"C\" __attribute__((visibility(\"default\"))) const rt_model_desc "
	        "kiln_model_desc = {\n\tRT_MODEL_ABI, %d, ", m->nsym);
	cstring(f, name);
	fprintf(f, ", kiln_sym_names, %d, %d, kiln_inputs, kiln_outputs, %d, %d, kiln_bufs,\n"
	        "\t%d, 0, %s_kernels, kiln_kernel_names, kiln_numel, kiln_io_dims, 0, 0, 0, NULL};\n",
	        m->ninputs, m->noutputs, m->nbuf, m->nslot, m->nkern, name);
	return KILN_OK;
}

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

static kiln_status write_emu(cg_session *s, const char *stage, const char *path,
                             kiln_error *err)
{
	if (strcmp(stage, "so") != 0)
		return write_cuda(s, stage, path, err);
	const cg_module *m = s->lib->m;
	char src[4300], obj[4300], tmp[4300], rt[4096];
	kiln_status st = cg_runtime_archive(rt, sizeof rt, err);
	if (st != KILN_OK)
		return st;
	if (snprintf(src, sizeof src, "%s.emu.cu", path) >= (int)sizeof src ||
	    snprintf(obj, sizeof obj, "%s.blob.o", path) >= (int)sizeof obj)
		return ir_seterr(err, KILN_EINVAL, "%s: path too long", path);
	cg_blob bl = {0};
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	fputs(s->text, f);
	st = describe(f, m, s->lib->name, &bl, err);
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
		char *argv[] = {"c++", "-std=c++14", "-O1", "-w", "-fPIC", "-fvisibility=hidden", "-shared",
		                "-DKILN_CUDA_EMULATE", "-I" KILN_SOURCE_DIR,
		                "-I" KILN_SOURCE_DIR "/include", "-x", "c++", src, "-x", "none", obj,
		                rt, "-o", tmp, "-Wl,-z,defs", "-lm", "-lpthread", "-ldl", NULL};
		st = cg_run_tool(path, argv, err);
		if (st == KILN_OK)
			st = cg_commit_file(tmp, path, err);
		else
			unlink(tmp);
	}
	unlink(src);
	unlink(obj);
	return st;
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
