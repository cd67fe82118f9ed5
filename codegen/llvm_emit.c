/*
 * llvm_emit.c: the LLVM backend behind codegen/backend.h's interface
 * (cg_llvm_backend).  A session is one library in one or more LLVM modules
 * ("parts", each in its own context, so that they can be optimized and
 * compiled on as many threads): llvm.c spreads the kernels over the parts,
 * the first part also gets the library around them (llvm_lib.c:
 * descriptors, entry points, training tables) and the GEMM helpers.  Then,
 * per part on a pool of threads (kiln_compile_opts.jobs): LLVMVerifyModule,
 * the new pass manager's default<O3> for the target machine, an object
 * file; then a link with the system C compiler against the never-sanitized
 * runtime archive (KILN_RT_GEN_LIB, or $KILN_RT_LIB), which puts the model
 * driver and thread pool into the library so it needs only libc, libm and
 * libpthread.  The weights do not go through LLVM: they are written to one
 * file that an assembler source includes (.incbin) and `cc -c` turns into
 * an object (cg_blob, llvm.h).  How many parts a library has depends on its
 * kernels only (cg_llvm_parts_for), never on the threads, so the library is
 * the same whatever machine compiled it.  --emit=ll|asm|obj writes a single
 * part with its weights inside.  LLVM diagnostics go to a handler per
 * context: errors become the compile's message, warnings (say, a loop
 * hinted for vectorization that LLVM would not vectorize) are dropped.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen/backend.h"
#include "codegen/llvm.h"

enum { MAX_PARTS = 8 };

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- LLVM ---------------------------------------------------------------- */

typedef struct diag {
	char msg[512];
} diag;

static void on_diag(LLVMDiagnosticInfoRef di, void *ud)
{
	diag *d = ud;
	if (LLVMGetDiagInfoSeverity(di) != LLVMDSError || d->msg[0])
		return;
	char *s = LLVMGetDiagInfoDescription(di);
	snprintf(d->msg, sizeof d->msg, "%s", s ? s : "error");
	LLVMDisposeMessage(s);
}

static void llvm_open(cg_llvm *L, const cg_target *t, const cg_module *m, const char *name,
                      diag *d)
{
	memset(L, 0, sizeof *L);
	L->ctx = LLVMContextCreate();
	LLVMContextSetDiagnosticHandler(L->ctx, on_diag, d);
	L->mod = LLVMModuleCreateWithNameInContext(name, L->ctx);
	L->b = LLVMCreateBuilderInContext(L->ctx);
	L->t = t;
	L->m = m;
	L->name = name;
	LLVMSetTarget(L->mod, t->triple);
	LLVMTargetDataRef td = LLVMCreateTargetDataLayout(t->tm);
	LLVMSetModuleDataLayout(L->mod, td);
	LLVMDisposeTargetData(td);
	L->i1 = LLVMInt1TypeInContext(L->ctx);
	L->i8 = LLVMInt8TypeInContext(L->ctx);
	L->i32 = LLVMInt32TypeInContext(L->ctx);
	L->i64 = LLVMInt64TypeInContext(L->ctx);
	L->f32 = LLVMFloatTypeInContext(L->ctx);
	L->f64 = LLVMDoubleTypeInContext(L->ctx);
	L->ptr = LLVMPointerType(L->i8, 0);
	/* struct rt_exec { void **buf; const int64_t *sym; rt_pool *pool;
	 *                  float *scratch; int64_t thread; rt_fault *fault; } */
	L->exec_ty = LLVMStructCreateNamed(L->ctx, "rt_exec");
	LLVMTypeRef f[6] = {LLVMPointerType(L->ptr, 0), LLVMPointerType(L->i64, 0), L->ptr,
	                    LLVMPointerType(L->f32, 0), L->i64, L->ptr};
	LLVMStructSetBody(L->exec_ty, f, 6, 0);
}

static void llvm_close(cg_llvm *L)
{
	if (L->b)
		LLVMDisposeBuilder(L->b);
	if (L->mod)
		LLVMDisposeModule(L->mod);
	if (L->ctx)
		LLVMContextDispose(L->ctx);
	memset(L, 0, sizeof *L);
}

/* The target's preferred vector width on every function defined, so that
 * the vectorizer does not follow a CPU's prefer-256-bit tuning (target.c). */
static void tune(cg_llvm *L)
{
	char w[16];
	snprintf(w, sizeof w, "%d", L->t->prefer_bits);
	for (LLVMValueRef f = LLVMGetFirstFunction(L->mod); f && L->t->prefer_bits;
	     f = LLVMGetNextFunction(f))
		if (!LLVMIsDeclaration(f))
			LLVMAddTargetDependentFunctionAttr(f, "prefer-vector-width", w);
}

static kiln_status verify(cg_llvm *L, kiln_error *err)
{
	char *msg = NULL;
	kiln_status st = KILN_OK;
	if (LLVMVerifyModule(L->mod, LLVMReturnStatusAction, &msg))
		st = ir_seterr(err, KILN_EINVAL, "LLVM rejected the generated module (a kiln bug): "
		               "%.900s", msg ? msg : "?");
	LLVMDisposeMessage(msg);
	return st;
}

static kiln_status optimize(cg_llvm *L, kiln_error *err)
{
	LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
	LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
	LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
	LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
	LLVMPassBuilderOptionsSetLoopInterleaving(po, 1);
	LLVMErrorRef e = LLVMRunPasses(L->mod, "default<O3>", L->t->tm, po);
	LLVMDisposePassBuilderOptions(po);
	if (!e)
		return KILN_OK;
	char *msg = LLVMGetErrorMessage(e);
	kiln_status st = ir_seterr(err, KILN_EINVAL, "LLVM pass pipeline failed: %s", msg);
	LLVMDisposeErrorMessage(msg);
	return st;
}

/* LLVM IR (after O3), assembly or an object file at path, atomically. */
/* LLVM IR (after O3), assembly or an object file straight into file. */
static kiln_status emit_file(cg_llvm *L, const char *emit, const char *file, kiln_error *err)
{
	char *msg = NULL;
	LLVMBool bad;
	if (strcmp(emit, "ll") == 0)
		bad = LLVMPrintModuleToFile(L->mod, file, &msg);
	else
		bad = LLVMTargetMachineEmitToFile(L->t->tm, L->mod, (char *)file,
		                                  strcmp(emit, "asm") == 0 ? LLVMAssemblyFile
		                                                           : LLVMObjectFile, &msg);
	kiln_status st = KILN_OK;
	if (bad)
		st = ir_seterr(err, KILN_EIO, "%s: LLVM could not write %s: %s", file, emit,
		               msg ? msg : "?");
	LLVMDisposeMessage(msg);
	return st;
}

/* The same at path, atomically (a user's file). */
static kiln_status write_stage(cg_llvm *L, const char *emit, const char *path, kiln_error *err)
{
	char tmp[4200];
	kiln_status st = cg_temp_file(path, 0666, tmp, sizeof tmp, err);
	if (st == KILN_OK && (st = emit_file(L, emit, tmp, err)) != KILN_OK)
		unlink(tmp);
	return st == KILN_OK ? cg_commit_file(tmp, path, err) : st;
}

/* ---- parts and threads --------------------------------------------------------- */

typedef struct part {
	cg_llvm L;
	cg_target t;
	diag d;
	char obj[4200];     /* its object file, once written */
	double opt_s, cg_s; /* seconds in O3 and in object emission */
	kiln_status st;
	kiln_error err;
} part;

struct cg_session {
	part *parts;
	int nparts;
	cg_blob blob;
	const cg_library *lib;
	LLVMValueRef *fns[2];  /* kernels of lib->m, lib->eval (in parts[0]) */
	const char *out;       /* "so": the library's path, for the parts' temporary files */
	pthread_mutex_t lock;
	int next;              /* the next part a thread takes */
};

/* Verify, O3, then the object (stage "so": a temporary file beside s->out)
 * or the stage's file. */
static kiln_status finish_part(part *p, const char *stage, const char *path, kiln_error *err)
{
	cg_llvm *L = &p->L;
	tune(L);
	kiln_status st = verify(L, err);
	double t0 = now();
	if (st == KILN_OK)
		st = optimize(L, err);
	double t1 = now();
	p->opt_s = t1 - t0;
	if (st == KILN_OK && strcmp(stage, "so") == 0) {
		st = cg_temp_file(path, 0666, p->obj, sizeof p->obj, err);
		if (st == KILN_OK)
			st = emit_file(L, "obj", p->obj, err);
	} else if (st == KILN_OK) {
		st = write_stage(L, stage, path, err);
	}
	p->cg_s = now() - t1;
	if (st == KILN_OK && p->d.msg[0])
		st = ir_seterr(err, KILN_EINVAL, "LLVM: %s", p->d.msg);
	return st;
}

static void *worker(void *arg)
{
	cg_session *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		int i = s->next++;
		pthread_mutex_unlock(&s->lock);
		if (i >= s->nparts)
			return NULL;
		part *p = &s->parts[i];
		p->st = finish_part(p, "so", s->out, &p->err);
	}
}

/* Every part on min(jobs, parts) threads, this one among them. */
static kiln_status finish_parts(cg_session *s, int jobs, kiln_error *err)
{
	pthread_t th[MAX_PARTS];
	int nth = 0;
	s->next = 0;
	for (; nth + 1 < jobs && nth + 1 < s->nparts; nth++)
		if (pthread_create(&th[nth], NULL, worker, s) != 0)
			break;
	worker(s);
	for (int i = 0; i < nth; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < s->nparts; i++)
		if (s->parts[i].st != KILN_OK) {
			*err = s->parts[i].err;
			return s->parts[i].st;
		}
	return KILN_OK;
}

static int online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > MAX_PARTS ? MAX_PARTS : (int)n;
}

/* ---- linking ---------------------------------------------------------------- */

/* cc -shared -o <tmp> <objects> <runtime archive> -lm -lpthread, then
 * rename.  No build ID: ld would hash every byte of the weights for it
 * (SHA-1 over ResNet-18's 85 MB: 0.15-0.6 s of a 0.75 s link).  The library is named (SONAME) after its file, so a program
 * linked with -l:model.so records that name.  Nothing it defines binds to
 * another library's definition: the runtime archive's symbols are hidden
 * (--exclude-libs), the module's own references are internal or hidden
 * (llvm.c), and -Bsymbolic binds whatever else is exported to itself. */
static kiln_status link_so(cg_session *s, const char *blob_obj, const char *path,
                           kiln_error *err)
{
	char so[4200];
	kiln_status st = cg_temp_file(path, 0777, so, sizeof so, err);
	if (st != KILN_OK)
		return st;
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	const char *rt = getenv("KILN_RT_LIB");
	char *head[] = {"cc", "-shared", "-Wl,-z,defs", "-Wl,-z,noexecstack", "-Wl,--build-id=none",
	                "-Wl,--exclude-libs,ALL", "-Wl,-Bsymbolic", "-Xlinker", "-soname",
	                "-Xlinker", (char *)base, "-o", so};
	char *tail[] = {(char *)(rt && *rt ? rt : KILN_RT_GEN_LIB), "-lm", "-lpthread", NULL};
	enum { NHEAD = sizeof head / sizeof *head, NTAIL = sizeof tail / sizeof *tail };
	char *argv[NHEAD + MAX_PARTS + 1 + NTAIL];
	int n = 0;
	for (int i = 0; i < NHEAD; i++)
		argv[n++] = head[i];
	for (int i = 0; i < s->nparts; i++)
		argv[n++] = s->parts[i].obj;
	if (blob_obj)
		argv[n++] = (char *)blob_obj;
	for (int i = 0; i < NTAIL; i++)
		argv[n++] = tail[i];
	st = cg_run_tool(argv, err);
	if (st == KILN_OK)
		st = cg_commit_file(so, path, err);
	else
		unlink(so);
	return st;
}

/* ---- the backend ------------------------------------------------------------ */

static bool linking(const cg_library *lib)
{
	return !lib->o->emit || strcmp(lib->o->emit, "so") == 0;
}

static kiln_status s_open(cg_session **out, const cg_library *lib, kiln_error *err)
{
	cg_session *s = calloc(1, sizeof *s);
	if (!s)
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	s->lib = lib;
	pthread_mutex_init(&s->lock, NULL);
	int n = 1;
	if (linking(lib)) {
		n = cg_llvm_parts_for(lib->m, MAX_PARTS);
		int ne = cg_llvm_parts_for(lib->eval, MAX_PARTS);
		n = ne > n ? ne : n;
	}
	s->parts = calloc((size_t)n, sizeof *s->parts);
	if (!s->parts) {
		free(s);
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	}
	kiln_status st = KILN_OK;
	for (int i = 0; i < n && st == KILN_OK; i++) {
		part *p = &s->parts[i];
		st = cg_target_init(&p->t, lib->o->cpu, lib->o->features, err);
		if (st != KILN_OK)
			break;
		s->nparts++;
		llvm_open(&p->L, &p->t, lib->m, lib->name, &p->d);
		p->L.helpers_extern = i > 0;
		p->L.blob = i == 0 && linking(lib) ? &s->blob : NULL;
	}
	*out = s;
	return st;
}

static kiln_status s_kernels(cg_session *s, const cg_module *m, kiln_error *err)
{
	int i = m == s->lib->m ? 0 : 1;
	if (!(s->fns[i] = calloc((size_t)m->nkern + 1, sizeof *s->fns[i])))
		return ir_seterr(err, KILN_ENOMEM, "out of memory emitting kernels");
	cg_llvm *parts[MAX_PARTS];
	for (int p = 0; p < s->nparts; p++)
		parts[p] = &s->parts[p].L;
	return cg_llvm_emit_kernels(parts, s->nparts, m, i, s->fns[i], err);
}

static kiln_status s_library(cg_session *s, kiln_error *err)
{
	cg_llvm *L0 = &s->parts[0].L;
	bool sgemm = false, transpose = false;
	for (int p = 1; p < s->nparts; p++) {
		sgemm = sgemm || s->parts[p].L.sgemm;
		transpose = transpose || s->parts[p].L.transpose;
	}
	if (sgemm)
		cg_llvm_sgemm(L0);
	if (transpose)
		cg_llvm_transpose(L0);
	if (s->nparts > 1)
		cg_llvm_export_helpers(L0);
	return cg_llvm_library(L0, s->lib, s->fns, err);
}

static kiln_status s_write(cg_session *s, const char *stage, const char *path, kiln_error *err)
{
	kiln_compile_times *tm = s->lib->o->times;
	int jobs = s->lib->o->jobs > 0 ? s->lib->o->jobs : online_cpus();
	if (strcmp(stage, "so") != 0)
		return finish_part(&s->parts[0], stage, path, err);
	double t0 = now();
	s->out = path;
	kiln_status st = finish_parts(s, jobs, err);
	double t1 = now();
	char blob_obj[4200] = "";
	if (st == KILN_OK && s->blob.nitem) {
		st = cg_temp_file(path, 0666, blob_obj, sizeof blob_obj, err);
		if (st == KILN_OK)
			st = cg_blob_write_object(&s->blob, blob_obj, err);
	}
	if (st == KILN_OK)
		st = link_so(s, blob_obj[0] ? blob_obj : NULL, path, err);
	if (blob_obj[0])
		unlink(blob_obj);
	if (tm) {
		tm->parts = s->nparts;
		tm->jobs = jobs < s->nparts ? jobs : s->nparts;
		tm->llvm = t1 - t0;
		tm->link = now() - t1;
		tm->weights_bytes = s->blob.size;
		for (int i = 0; i < s->nparts; i++) {
			tm->optimize += s->parts[i].opt_s;
			tm->codegen += s->parts[i].cg_s;
		}
	}
	return st;
}

static void s_close(cg_session *s)
{
	for (int i = 0; i < s->nparts; i++) {
		part *p = &s->parts[i];
		if (p->obj[0])
			unlink(p->obj);
		llvm_close(&p->L);
		cg_target_free(&p->t);
	}
	free(s->parts);
	cg_blob_free(&s->blob);
	pthread_mutex_destroy(&s->lock);
	free(s->fns[0]);
	free(s->fns[1]);
	free(s);
}

static const char *const stages[] = {"ll", "asm", "obj", NULL};

const cg_backend cg_llvm_backend = {
	.name = "llvm",
	.stages = stages,
	.supports = cg_llvm_supports,
	.open = s_open,
	.emit_kernels = s_kernels,
	.emit_library = s_library,
	.write = s_write,
	.close = s_close,
};
