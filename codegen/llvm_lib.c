/*
 * llvm_lib.c: the generated library's interface around the kernels that
 * llvm.c emits: per program its rt_model_desc (the exact layout of
 * runtime/model.h: buffers, slots, signature, kernels, the numel and
 * io_dims functions llvm.c builds from the buffers' kernel-IR dims;
 * weights as 64-byte aligned private globals) exported as
 * `kiln_model_desc`, and the typed entry points
 * <name>_create/_run/_destroy/_set_threads/_errmsg over runtime/model.c;
 * for a training library the state table, both programs' descriptions,
 * `kiln_train_desc` and the entry points over runtime/model_train.c.
 * Everything else has internal linkage, the runtime functions the module
 * calls are declared hidden (the runtime archive is linked into the same
 * library), and the exported descriptions are aliases of internal
 * constants, so no reference of the library's own goes through the GOT or
 * PLT and two libraries in one process never resolve to each other's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/llvm.h"
#include "runtime/model.h"

static LLVMValueRef i64c(const cg_llvm *L, int64_t v) { return cg_llvm_i64(L, v); }
static LLVMValueRef i32c(const cg_llvm *L, int64_t v) { return cg_llvm_i32(L, v); }
static LLVMTypeRef mty(const cg_llvm *L, kiln_dtype dt) { return cg_llvm_mem_type(L, dt); }
static LLVMTypeRef exec_ptr(const cg_llvm *L) { return LLVMPointerType(L->exec_ty, 0); }
static LLVMValueRef add_fn(cg_llvm *L, const char *name, LLVMTypeRef ty, bool internal)
{
	return cg_llvm_fn(L, name, ty, internal);
}

/* ---- the rt_model_desc -------------------------------------------------------- */

static LLVMValueRef global(cg_llvm *L, LLVMTypeRef ty, LLVMValueRef init, const char *name,
                           unsigned align)
{
	LLVMValueRef g = LLVMAddGlobal(L->mod, ty, name);
	LLVMSetInitializer(g, init);
	LLVMSetGlobalConstant(g, 1);
	LLVMSetLinkage(g, LLVMPrivateLinkage);
	LLVMSetUnnamedAddr(g, 1);
	if (align)
		LLVMSetAlignment(g, align);
	return g;
}

static LLVMValueRef as_ptr(cg_llvm *L, LLVMValueRef g)
{
	return LLVMConstBitCast(g, L->ptr);
}

LLVMValueRef cg_llvm_bytes(cg_llvm *L, const void *data, size_t n, const char *name)
{
	if (!L->blob) {
		LLVMValueRef init = LLVMConstStringInContext(L->ctx, n ? data : "",
		                                             (unsigned)(n ? n : 1), 1);
		return as_ptr(L, global(L, LLVMTypeOf(init), init, name, 64));
	}
	if (!L->blob_sym) {
		L->blob_sym = LLVMAddGlobal(L->mod, LLVMArrayType(L->i8, 0), CG_BLOB_SYMBOL);
		LLVMSetVisibility(L->blob_sym, LLVMHiddenVisibility);
		LLVMSetGlobalConstant(L->blob_sym, 1);
		LLVMSetAlignment(L->blob_sym, 64);
	}
	int64_t at = cg_blob_add(L->blob, data, n);
	if (at < 0)
		return LLVMConstNull(L->ptr);
	/* not inbounds: LLVM sees a [0 x i8] */
	return LLVMConstGEP2(L->i8, as_ptr(L, L->blob_sym), (LLVMValueRef[]){i64c(L, at)},
	                     1);
}

static LLVMValueRef cstr(cg_llvm *L, const char *s)
{
	s = s ? s : "";
	LLVMValueRef init = LLVMConstStringInContext(L->ctx, s, (unsigned)strlen(s), 0);
	return as_ptr(L, global(L, LLVMTypeOf(init), init, "kiln.str", 1));
}

LLVMValueRef cg_llvm_cstr(cg_llvm *L, const char *s)
{
	return cstr(L, s);
}

/* A private constant array of n elements of ty (NULL pointer when n == 0). */
static LLVMValueRef array(cg_llvm *L, LLVMTypeRef ty, LLVMValueRef *v, int n, const char *name)
{
	if (n == 0)
		return LLVMConstNull(LLVMPointerType(ty, 0));
	LLVMValueRef init = LLVMConstArray(ty, v, (unsigned)n);
	LLVMValueRef g = global(L, LLVMTypeOf(init), init, name, 8);
	LLVMValueRef zero[2] = {i64c(L, 0), i64c(L, 0)};
	return LLVMConstInBoundsGEP2(LLVMTypeOf(init), g, zero, 2);
}

typedef struct desc_types {
	LLVMTypeRef io, buf, desc, kfn, sizes_fn, chunk;
} desc_types;

static void make_desc_types(cg_llvm *L, desc_types *t)
{
	LLVMTypeRef i32 = L->i32, i64p = LLVMPointerType(L->i64, 0);
	LLVMTypeRef io[] = {L->ptr, i32, i32, i64p, LLVMPointerType(i32, 0), i32, i32};
	LLVMTypeRef bf[] = {i32, i32, i32, i32, L->ptr};
	LLVMTypeRef kt = exec_ptr(L), st[2] = {i64p, i64p};
	t->io = LLVMStructTypeInContext(L->ctx, io, 7, 0);
	t->buf = LLVMStructTypeInContext(L->ctx, bf, 5, 0);
	t->kfn = LLVMPointerType(LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), &kt, 1, 0), 0);
	t->sizes_fn = LLVMPointerType(LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), st, 2, 0), 0);
	LLVMTypeRef pp = LLVMPointerType(L->ptr, 0), iop = LLVMPointerType(t->io, 0);
	LLVMTypeRef d[] = {i32, i32, L->ptr, pp, i32, i32, iop, iop, i32, i32,
	                   LLVMPointerType(t->buf, 0), i32, i32, LLVMPointerType(t->kfn, 0),
	                   pp, t->sizes_fn, t->sizes_fn, L->i64, i32, i32, L->ptr,
	                   i32, i32, L->ptr, LLVMPointerType(i32, 0)};
	LLVMTypeRef ch[] = {i32, i32, i32, i32, i32, i32, LLVMPointerType(i32, 0)};
	t->chunk = LLVMStructTypeInContext(L->ctx, ch, 7, 0);
	t->desc = LLVMStructTypeInContext(L->ctx, d, sizeof d / sizeof *d, 0);
}

static LLVMValueRef io_desc(cg_llvm *L, const desc_types *t, int b)
{
	const cg_module *m = L->m;
	const cg_buf *bf = &m->buf[b];
	LLVMValueRef dims[KILN_MAX_RANK], kinds[KILN_MAX_RANK];
	for (int d = 0; d < bf->type.rank; d++) {
		const cg_expr *e = bf->dim[d];
		int64_t v = !e ? bf->type.dim[d] : e->kind == CG_CONST ? e->i : -1;
		int sym = e && e->kind == CG_SIZE ? e->var : -1;
		int kind = v >= 0 ? RT_DIM_FIXED : sym >= 0 ? RT_DIM_SYM : RT_DIM_EXPR;
		dims[d] = i64c(L, kind == RT_DIM_FIXED ? v : kind == RT_DIM_SYM ? sym : 0);
		kinds[d] = i32c(L, kind);
	}
	LLVMValueRef f[] = {cstr(L, bf->name ? bf->name : ""), i32c(L, bf->dt),
	                    i32c(L, bf->type.rank),
	                    array(L, L->i64, dims, bf->type.rank, "kiln.dims"),
	                    array(L, L->i32, kinds, bf->type.rank, "kiln.dim_kind"),
	                    i32c(L, b), i32c(L, 0)};
	return LLVMConstNamedStruct(t->io, f, 7);
}

static LLVMValueRef ios(cg_llvm *L, const desc_types *t, const int *bufs, int n)
{
	LLVMValueRef *v = calloc((size_t)n + 1, sizeof *v);
	if (!v)
		return NULL;
	for (int i = 0; i < n; i++)
		v[i] = io_desc(L, t, bufs[i]);
	LLVMValueRef a = array(L, t->io, v, n, "kiln.io");
	free(v);
	return a;
}

/* Weights: private constants, 64-byte aligned, their bytes verbatim. */
static LLVMValueRef weights(cg_llvm *L, const cg_buf *b, kiln_error *err, kiln_status *st)
{
	if (b->kind != CG_BUF_CONST || b->alias >= 0)
		return LLVMConstNull(L->ptr);
	if (!b->data || b->data->dtype != b->dt) {
		*st = ir_seterr(err, KILN_EINVAL, "LLVM backend: constant buffer %d ('%s') has "
		                "no data of its dtype", b->id, b->name ? b->name : "");
		return LLVMConstNull(L->ptr);
	}
	return cg_llvm_bytes(L, b->data->data, kiln_tensor_nbytes(b->data), "kiln.weight");
}

static LLVMValueRef bufs(cg_llvm *L, const desc_types *t, kiln_error *err, kiln_status *st)
{
	static const int kinds[] = {[CG_BUF_INPUT] = RT_BUF_INPUT, [CG_BUF_OUTPUT] = RT_BUF_OUTPUT,
	                            [CG_BUF_CONST] = RT_BUF_CONST, [CG_BUF_TEMP] = RT_BUF_TEMP,
	                            [CG_BUF_STATE] = RT_BUF_STATE};
	const cg_module *m = L->m;
	LLVMValueRef *v = calloc((size_t)m->nbuf + 1, sizeof *v);
	if (!v)
		return NULL;
	for (int i = 0; i < m->nbuf; i++) {
		const cg_buf *b = &m->buf[i];
		int slot = b->kind == CG_BUF_STATE ? b->io_index
		           : b->kind == CG_BUF_TEMP && b->alias < 0 ? b->slot : -1;
		LLVMValueRef f[] = {i32c(L, kinds[b->kind]), i32c(L, b->dt), i32c(L, slot),
		                    i32c(L, b->alias), weights(L, b, err, st)};
		v[i] = LLVMConstNamedStruct(t->buf, f, 5);
	}
	LLVMValueRef a = array(L, t->buf, v, m->nbuf, "kiln.bufs");
	free(v);
	return a;
}

/* [nchunk x rt_chunk_desc] (NULL when none) and chunk_of, per buffer */
static LLVMValueRef chunk_tables(cg_llvm *L, const desc_types *t, LLVMValueRef *chunk_of)
{
	const cg_module *m = L->m;
	LLVMValueRef *v = calloc((size_t)m->nchunk + (size_t)m->nbuf + 1, sizeof *v);
	if (!v)
		return NULL;
	for (int r = 0; r < m->nchunk; r++) {
		const cg_chunk_run *c = &m->chunk[r];
		LLVMValueRef *off = v + m->nchunk;
		for (int i = 0; i < c->noff; i++)
			off[i] = i32c(L, c->off[i]);
		LLVMValueRef offs = array(L, L->i32, off, c->noff, "kiln.chunk_off");
		LLVMValueRef f[] = {i32c(L, c->first), i32c(L, c->last), i32c(L, c->sym),
		                    i32c(L, c->chunk), i32c(L, c->noff), i32c(L, 0), offs};
		v[r] = LLVMConstNamedStruct(t->chunk, f, 7);
	}
	LLVMValueRef a = array(L, t->chunk, v, m->nchunk, "kiln.chunks");
	for (int b = 0; b < m->nbuf; b++)
		v[b] = i32c(L, m->buf[b].chunk);
	*chunk_of = m->nchunk ? array(L, L->i32, v, m->nbuf, "kiln.chunk_of")
	                      : LLVMConstNull(LLVMPointerType(L->i32, 0));
	free(v);
	return a;
}

static LLVMValueRef sym_names(cg_llvm *L)
{
	const cg_module *m = L->m;
	LLVMValueRef *v = calloc((size_t)m->nsym + 1, sizeof *v);
	if (!v)
		return NULL;
	for (int k = 0; k < m->nsym; k++)
		v[k] = cstr(L, m->symname ? m->symname[k] : "");
	LLVMValueRef a = array(L, L->ptr, v, m->nsym, "kiln.sym_names");
	free(v);
	return a;
}

static LLVMValueRef kernel_tables(cg_llvm *L, const desc_types *t, LLVMValueRef *fns,
                                  LLVMValueRef *names_out)
{
	const cg_module *m = L->m;
	LLVMValueRef *names = calloc((size_t)m->nkern + 1, sizeof *names);
	if (!names)
		return NULL;
	for (int k = 0; k < m->nkern; k++)
		names[k] = cstr(L, m->kern[k].name);
	*names_out = array(L, L->ptr, names, m->nkern, "kiln.kernel_names");
	free(names);
	return array(L, t->kfn, fns, m->nkern, "kiln.kernels");
}

/* A description: an internal constant "kiln.<name>" that the library's own
 * code refers to, PC-relative, plus the exported alias <name> that
 * kiln_load finds with dlsym (NULL name: not exported).  Referring to the
 * exported name instead would go through the GOT, where the first library
 * a process loaded with the same name would win. */
static LLVMValueRef desc_global(cg_llvm *L, LLVMTypeRef ty, LLVMValueRef init, const char *name)
{
	char local[64];
	snprintf(local, sizeof local, "kiln.%s", name ? name : "step_desc");
	LLVMValueRef g = LLVMAddGlobal(L->mod, ty, local);
	LLVMSetInitializer(g, init);
	LLVMSetGlobalConstant(g, 1);
	LLVMSetLinkage(g, LLVMInternalLinkage);
	LLVMSetAlignment(g, 8);
	if (name)
		LLVMAddAlias2(L->mod, ty, 0, g, name);
	return g;
}

/* The program's description (runtime/model.h's layout, field by field),
 * exported as gname (NULL: not exported); state: the shared state table
 * (NULL pointer, nstate 0 for an inference model). */
typedef struct state_ref {
	LLVMValueRef table;
	int n;
} state_ref;

static LLVMValueRef model_desc(cg_llvm *L, LLVMValueRef *kfns, LLVMValueRef numel,
                               LLVMValueRef io_dims, const char *gname, state_ref state,
                               kiln_error *err, kiln_status *st)
{
	const cg_module *m = L->m;
	desc_types t;
	make_desc_types(L, &t);
	LLVMValueRef knames = NULL, kerns = kernel_tables(L, &t, kfns, &knames);
	LLVMValueRef in = ios(L, &t, m->inputs, m->ninputs), out = ios(L, &t, m->outputs, m->noutputs);
	LLVMValueRef bd = bufs(L, &t, err, st), names = sym_names(L);
	LLVMValueRef chunk_of = NULL, chunks = chunk_tables(L, &t, &chunk_of);
	if (!kerns || !in || !out || !bd || !names || !chunks) {
		*st = ir_seterr(err, KILN_ENOMEM, "out of memory building the model description");
		return NULL;
	}
	LLVMValueRef f[] = {
		i32c(L, RT_MODEL_ABI), i32c(L, m->nsym), cstr(L, L->name), names,
		i32c(L, m->ninputs), i32c(L, m->noutputs), in, out,
		i32c(L, m->nbuf), i32c(L, m->nslot), bd, i32c(L, m->nkern), i32c(L, 0),
		kerns, knames, numel, io_dims,
		LLVMConstInt(L->i64, cg_sgemm_scratch_floats(L->t), 0), i32c(L, state.n), i32c(L, 0),
		state.table ? state.table : LLVMConstNull(L->ptr), i32c(L, m->nchunk), i32c(L, 0),
		chunks, chunk_of};
	return desc_global(L, t.desc, LLVMConstNamedStruct(t.desc, f, sizeof f / sizeof *f),
	                   gname);
}

/* ---- typed entry points -------------------------------------------------------- */

static LLVMValueRef entry_fn(cg_llvm *L, const char *suffix, LLVMTypeRef ret, LLVMTypeRef *pt,
                             int n)
{
	char name[300];
	snprintf(name, sizeof name, "%s_%s", L->name, suffix);
	LLVMValueRef f = add_fn(L, name, LLVMFunctionType(ret, pt, (unsigned)n, 0), false);
	LLVMPositionBuilderAtEnd(L->b, LLVMAppendBasicBlockInContext(L->ctx, f, "entry"));
	return f;
}

static LLVMValueRef rt_call(cg_llvm *L, const char *name, LLVMTypeRef ret, LLVMTypeRef *pt,
                            LLVMValueRef *args, int n)
{
	LLVMTypeRef ft = LLVMFunctionType(ret, pt, (unsigned)n, 0);
	return LLVMBuildCall2(L->b, ft, cg_llvm_runtime_fn(L, name, ft), args, (unsigned)n, "");
}

/* An [n x ty] stack array holding the function's parameters from first. */
static LLVMValueRef param_array(cg_llvm *L, LLVMValueRef f, int first, int n, LLVMTypeRef ty)
{
	if (n == 0)
		return LLVMConstNull(LLVMPointerType(ty, 0));
	LLVMValueRef a = LLVMBuildArrayAlloca(L->b, ty, i32c(L, n), "");
	for (int i = 0; i < n; i++) {
		LLVMValueRef p = LLVMBuildInBoundsGEP2(L->b, ty, a, (LLVMValueRef[]){i64c(L, i)}, 1, "");
		LLVMValueRef v = LLVMGetParam(f, (unsigned)(first + i));
		LLVMBuildStore(L->b, LLVMTypeOf(v) == ty ? v : LLVMBuildBitCast(L->b, v, ty, ""), p);
	}
	return a;
}

/* int <name>_<suffix>(ctx, int64_t sym..., const T *in..., T *out...)
 * calling callee(ctx, syms, in, out) of the runtime. */
static void run_entry(cg_llvm *L, const char *suffix, const char *callee)
{
	const cg_module *m = L->m;
	int n = 1 + m->nsym + m->ninputs + m->noutputs;
	LLVMTypeRef *pt = calloc((size_t)n, sizeof *pt);
	if (!pt)
		return;
	pt[0] = L->ptr;
	for (int i = 1; i < n; i++) {
		int io = i - 1 - m->nsym;
		int b = io < 0 ? -1 : io < m->ninputs ? m->inputs[io] : m->outputs[io - m->ninputs];
		pt[i] = b < 0 ? L->i64 : LLVMPointerType(mty(L, m->buf[b].dt), 0);
	}
	LLVMValueRef f = entry_fn(L, suffix, L->i32, pt, n);
	LLVMValueRef syms = param_array(L, f, 1, m->nsym, L->i64);
	LLVMValueRef in = param_array(L, f, 1 + m->nsym, m->ninputs, L->ptr);
	LLVMValueRef out = param_array(L, f, 1 + m->nsym + m->ninputs, m->noutputs, L->ptr);
	LLVMTypeRef rt[4] = {L->ptr, LLVMPointerType(L->i64, 0), LLVMPointerType(L->ptr, 0),
	                     LLVMPointerType(L->ptr, 0)};
	LLVMValueRef args[4] = {LLVMGetParam(f, 0), syms, in, out};
	LLVMBuildRet(L->b, rt_call(L, callee, L->i32, rt, args, 4));
	free(pt);
}

/* _create (NULL on failure), _destroy, _set_threads, _errmsg over the
 * runtime's rt_<rt>_create... (rt_model: model.c, rt_train: model_train.c). */
static void lifecycle(cg_llvm *L, LLVMValueRef desc, const char *rt)
{
	char fn[4][64];
	const char *what[4] = {"create", "destroy", "set_threads", "errmsg"};
	for (int i = 0; i < 4; i++)
		snprintf(fn[i], sizeof fn[i], "rt_%s_%s", rt, what[i]);
	LLVMTypeRef pp = LLVMPointerType(L->ptr, 0), vt = LLVMVoidTypeInContext(L->ctx);
	LLVMTypeRef ct[2] = {L->ptr, pp}, st[2] = {L->ptr, L->i32};
	entry_fn(L, "create", L->ptr, NULL, 0);
	LLVMValueRef slot = LLVMBuildAlloca(L->b, L->ptr, "");
	LLVMBuildStore(L->b, LLVMConstNull(L->ptr), slot);
	LLVMValueRef args[2] = {as_ptr(L, desc), slot};
	LLVMValueRef rc = rt_call(L, fn[0], L->i32, ct, args, 2);
	LLVMValueRef ok = LLVMBuildICmp(L->b, LLVMIntEQ, rc, i32c(L, KILN_OK), "");
	LLVMBuildRet(L->b, LLVMBuildSelect(L->b, ok, LLVMBuildLoad2(L->b, L->ptr, slot, ""),
	                                   LLVMConstNull(L->ptr), ""));
	LLVMValueRef f = entry_fn(L, "destroy", vt, ct, 1);
	LLVMValueRef p = LLVMGetParam(f, 0);
	rt_call(L, fn[1], vt, ct, &p, 1);
	LLVMBuildRetVoid(L->b);
	f = entry_fn(L, "set_threads", L->i32, st, 2);
	LLVMValueRef a2[2] = {LLVMGetParam(f, 0), LLVMGetParam(f, 1)};
	LLVMBuildRet(L->b, rt_call(L, fn[2], L->i32, st, a2, 2));
	f = entry_fn(L, "errmsg", L->ptr, ct, 1);
	p = LLVMGetParam(f, 0);
	LLVMBuildRet(L->b, rt_call(L, fn[3], L->ptr, ct, &p, 1));
}

static void entries(cg_llvm *L, LLVMValueRef desc)
{
	lifecycle(L, desc, "model");
	run_entry(L, "run", "rt_model_run");
}

/* ---- the module ------------------------------------------------------------------ */

/* L->m's description from its kernels fns, the global gname, into *desc. */
static kiln_status program(cg_llvm *L, LLVMValueRef *fns, const char *gname, state_ref state,
                           LLVMValueRef *desc, kiln_error *err)
{
	LLVMValueRef numel = NULL, io_dims = NULL;
	kiln_status st = cg_llvm_sizes(L, &numel, &io_dims, err);
	*desc = st == KILN_OK ? model_desc(L, fns, numel, io_dims, gname, state, err, &st) : NULL;
	return st;
}

static kiln_status train_library(cg_llvm *L, const cg_module *eval, LLVMValueRef *step_fns,
                                 LLVMValueRef *eval_fns, const cg_train_info *ti,
                                 kiln_error *err);

kiln_status cg_llvm_library(cg_llvm *L, const cg_library *lib, LLVMValueRef *const *fns,
                            kiln_error *err)
{
	L->m = lib->m;
	if (lib->ti)
		return train_library(L, lib->eval, fns[0], fns[1], lib->ti, err);
	LLVMValueRef desc = NULL;
	kiln_status st = program(L, fns[0], "kiln_model_desc", (state_ref){NULL, 0}, &desc, err);
	if (st == KILN_OK)
		entries(L, desc);
	return st;
}

/* ---- training libraries ------------------------------------------------------------
 * Two programs in one module: the step (L->m) and eval, each with its own
 * kernels and description, whose STATE buffers index one shared state
 * table; then kiln_train_desc tying them together, and the entry points. */

static LLVMValueRef bytes_global(cg_llvm *L, const kiln_tensor *t)
{
	return cg_llvm_bytes(L, t->data, kiln_tensor_nbytes(t), "kiln.state_init");
}

/* [nstate x rt_state_desc] {name, dtype, rank, dims, init} */
static LLVMValueRef state_table(cg_llvm *L, const cg_train_info *ti)
{
	LLVMTypeRef f[] = {L->ptr, L->i32, L->i32, LLVMPointerType(L->i64, 0), L->ptr};
	LLVMTypeRef ty = LLVMStructTypeInContext(L->ctx, f, 5, 0);
	LLVMValueRef *v = calloc((size_t)ti->nstate + 1, sizeof *v);
	if (!v)
		return NULL;
	for (int i = 0; i < ti->nstate; i++) {
		const kiln_tensor *t = ti->state_init[i];
		LLVMValueRef dims[KILN_MAX_RANK];
		for (int d = 0; d < t->rank; d++)
			dims[d] = i64c(L, t->shape[d]);
		LLVMValueRef e[] = {cstr(L, ti->state_name[i]), i32c(L, t->dtype), i32c(L, t->rank),
		                    array(L, L->i64, dims, t->rank, "kiln.state_dims"),
		                    bytes_global(L, t)};
		v[i] = LLVMConstNamedStruct(ty, e, 5);
	}
	LLVMValueRef a = as_ptr(L, array(L, ty, v, ti->nstate, "kiln.state"));
	free(v);
	return a;
}

/* `kiln_train_desc`: {abi, accum, step, eval, next, lr, t, apply, micro + 1,
 * ready, split, pad} */
static LLVMValueRef train_desc(cg_llvm *L, LLVMValueRef step, LLVMValueRef eval,
                               const cg_train_info *ti)
{
	int n = L->m->noutputs;
	LLVMValueRef *next = calloc((size_t)n + 1, sizeof *next);
	LLVMValueRef *ready = calloc((size_t)n + 1, sizeof *ready);
	if (!next || !ready) {
		free(next), free(ready);
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		next[i] = i32c(L, ti->next[i]);
		ready[i] = i32c(L, ti->ready && ti->split >= 0 ? ti->ready[i] : -1);
	}
	LLVMValueRef f[] = {i32c(L, RT_MODEL_ABI), i32c(L, ti->accum), as_ptr(L, step),
	                    as_ptr(L, eval), array(L, L->i32, next, n, "kiln.next"),
	                    i32c(L, ti->lr), i32c(L, ti->t), i32c(L, ti->apply), i32c(L, ti->micro + 1),
	                    array(L, L->i32, ready, n, "kiln.ready"),
	                    i32c(L, ti->ready ? ti->split : -1), i32c(L, 0)};
	free(next), free(ready);
	enum { NF = sizeof f / sizeof f[0] };
	LLVMTypeRef ft[NF];
	for (int i = 0; i < NF; i++)
		ft[i] = LLVMTypeOf(f[i]);
	LLVMTypeRef ty = LLVMStructTypeInContext(L->ctx, ft, NF, 0);
	return desc_global(L, ty, LLVMConstNamedStruct(ty, f, NF), "kiln_train_desc");
}

/* int <name>_train_step(ctx, int64_t sym..., const T *data..., double lr,
 * T *loss) over rt_train_step(ctx, syms, in, lr, loss). */
static void train_step_entry(cg_llvm *L, const cg_train_info *ti)
{
	const cg_module *m = L->m;
	int ndata = m->ninputs - 2 - (ti->apply >= 0) - (ti->micro >= 0);
	int n = 1 + m->nsym + ndata + 2;
	LLVMTypeRef *pt = calloc((size_t)n, sizeof *pt);
	if (!pt)
		return;
	pt[0] = L->ptr;
	for (int i = 1, k = 0; i <= m->nsym + ndata; i++) {
		while (i > m->nsym && (k == ti->lr || k == ti->t || k == ti->apply || k == ti->micro))
			k++;
		pt[i] = i <= m->nsym ? L->i64 : LLVMPointerType(mty(L, m->buf[m->inputs[k++]].dt), 0);
	}
	pt[n - 2] = L->f64;
	pt[n - 1] = LLVMPointerType(mty(L, m->buf[m->outputs[0]].dt), 0);
	LLVMValueRef f = entry_fn(L, "train_step", L->i32, pt, n);
	LLVMValueRef syms = param_array(L, f, 1, m->nsym, L->i64);
	LLVMValueRef in = param_array(L, f, 1 + m->nsym, ndata, L->ptr);
	LLVMTypeRef rt[5] = {L->ptr, LLVMPointerType(L->i64, 0), LLVMPointerType(L->ptr, 0), L->f64,
	                     L->ptr};
	LLVMValueRef loss = LLVMBuildBitCast(L->b, LLVMGetParam(f, (unsigned)n - 1), L->ptr, "");
	LLVMValueRef args[5] = {LLVMGetParam(f, 0), syms, in, LLVMGetParam(f, (unsigned)n - 2), loss};
	LLVMBuildRet(L->b, rt_call(L, "rt_train_step", L->i32, rt, args, 5));
	free(pt);
}

/* _save(ctx, path), _load(ctx, path), _steps(ctx) */
static void ckpt_entries(cg_llvm *L)
{
	LLVMTypeRef pt[2] = {L->ptr, L->ptr};
	const char *what[2] = {"save", "load"}, *rt[2] = {"rt_train_save", "rt_train_load"};
	for (int i = 0; i < 2; i++) {
		LLVMValueRef f = entry_fn(L, what[i], L->i32, pt, 2);
		LLVMValueRef a[2] = {LLVMGetParam(f, 0), LLVMGetParam(f, 1)};
		LLVMBuildRet(L->b, rt_call(L, rt[i], L->i32, pt, a, 2));
	}
	LLVMValueRef f = entry_fn(L, "steps", L->i64, pt, 1);
	LLVMValueRef p = LLVMGetParam(f, 0);
	LLVMBuildRet(L->b, rt_call(L, "rt_train_steps", L->i64, pt, &p, 1));
}

static kiln_status train_library(cg_llvm *L, const cg_module *eval, LLVMValueRef *step_fns,
                                 LLVMValueRef *eval_fns, const cg_train_info *ti,
                                 kiln_error *err)
{
	const cg_module *step = L->m;
	state_ref state = {state_table(L, ti), ti->nstate};
	if (!state.table)
		return ir_seterr(err, KILN_ENOMEM, "out of memory emitting the state table");
	LLVMValueRef sd = NULL, ed = NULL;
	kiln_status st = program(L, step_fns, NULL, state, &sd, err);
	if (st == KILN_OK) {
		L->m = eval;
		st = program(L, eval_fns, "kiln_model_desc", state, &ed, err);
	}
	if (st == KILN_OK)
		run_entry(L, "eval_step", "rt_train_eval");
	L->m = step;
	LLVMValueRef td = st == KILN_OK ? train_desc(L, sd, ed, ti) : NULL;
	if (st == KILN_OK && !td)
		st = ir_seterr(err, KILN_ENOMEM, "out of memory emitting the training description");
	if (st == KILN_OK) {
		lifecycle(L, td, "train");
		train_step_entry(L, ti);
		ckpt_entries(L);
	}
	return st;
}
