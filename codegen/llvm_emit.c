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
 * runtime archive (found when the session opens, before any LLVM work:
 * rtpath.c, $KILN_RT_LIB first), which puts the model
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
#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm/Config/llvm-config.h>
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

/* What optimize() and the target machine (target.c) do, for the cache's key:
 * change it with either. */
#define PIPELINE "default<O3> loop-vectorize slp-vectorize unroll interleave; pic O3 epoch 1"

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
	const char *cache;  /* the helpers' part: the object cache's folder, or NULL */
	bool cached;        /* obj is the cache's file (not to be removed) */
	double opt_s, cg_s; /* seconds in O3 and in object emission */
	kiln_status st;
	kiln_error err;
} part;

struct cg_session {
	part *parts;
	int nparts;
	int nkparts;           /* parts[0, nkparts) hold kernels; a last one, if any,
	                          only kiln_sgemm and kiln_transpose */
	cg_blob blob;
	const cg_library *lib;
	LLVMValueRef *fns[2];  /* kernels of lib->m, lib->eval (in parts[0]) */
	const char *out;       /* "so": the library's path, for the parts' temporary files */
	pthread_mutex_t lock;
	int next;              /* the next part a thread takes */
	char cache_buf[4096];  /* the object cache's folder */
	char rt[4096];         /* the runtime archive (cg_runtime_archive), when linking */
};

/* Verify, O3, then the object (stage "so": a temporary file beside s->out)
 * or the stage's file. */
/* ---- the helpers' object cache ----------------------------------------------------
 * kiln_sgemm and kiln_transpose depend on the target alone, yet took about
 * 0.9 s of LLVM in every compile (all of it for an MLP).  Their part's
 * object is kept in the cache folder (cache_dir), named by a hash of
 * everything it is made from: the module's IR, the target triple, CPU,
 * features and vector width, LLVM's and kiln's versions and the pipeline.
 * Written atomically (a temporary file renamed), read only when whole; a
 * folder that cannot be written only means no caching. */

static void fnv(uint64_t *h, const char *s)
{
	for (; s && *s; s++)
		*h = (*h ^ (unsigned char)*s) * 0x100000001b3ULL;
	*h = (*h ^ 0xff) * 0x100000001b3ULL; /* a separator */
}

/* dir/helpers-<128-bit hash>.o into path. */
static void cache_path(part *p, char *path, size_t size)
{
	char *ir = LLVMPrintModuleToString(p->L.mod), w[16];
	snprintf(w, sizeof w, "%d", p->t.prefer_bits);
	const char *parts[] = {ir, p->t.triple, p->t.cpu, p->t.features, w, LLVM_VERSION_STRING,
	                       KILN_VERSION, PIPELINE};
	uint64_t h[2] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL};
	for (int k = 0; k < 2; k++)
		for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
			fnv(&h[k], k ? parts[sizeof parts / sizeof *parts - 1 - i] : parts[i]);
	LLVMDisposeMessage(ir);
	snprintf(path, size, "%s/helpers-%016llx%016llx.o", p->cache, (unsigned long long)h[0],
	         (unsigned long long)h[1]);
}

/* mkdir -p dir (best effort). */
static void make_dirs(const char *dir)
{
	char b[4096];
	snprintf(b, sizeof b, "%s", dir);
	for (char *c = b + 1; *c; c++)
		if (*c == '/') {
			*c = 0;
			mkdir(b, 0755);
			*c = '/';
		}
	mkdir(b, 0755);
}

/* A copy of src at dst, atomically; failures are ignored. */
static void cache_store(const char *src, const char *dst)
{
	char tmp[4200];
	snprintf(tmp, sizeof tmp, "%s.tmp%ld", dst, (long)getpid());
	FILE *in = fopen(src, "rb"), *out = in ? fopen(tmp, "wb") : NULL;
	char buf[65536];
	size_t n;
	bool ok = in && out;
	while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
		ok = fwrite(buf, 1, n, out) == n;
	ok = ok && !ferror(in);
	if (in)
		fclose(in);
	if (out && fclose(out) != 0)
		ok = false;
	if (!ok || rename(tmp, dst) != 0)
		unlink(tmp);
}

static kiln_status finish_part(part *p, const char *stage, const char *path, kiln_error *err)
{
	cg_llvm *L = &p->L;
	tune(L);
	kiln_status st = verify(L, err);
	char cached[4200] = "";
	if (st == KILN_OK && p->cache && strcmp(stage, "so") == 0) {
		cache_path(p, cached, sizeof cached);
		if (access(cached, R_OK) == 0) {
			snprintf(p->obj, sizeof p->obj, "%s", cached);
			p->cached = true;
			return KILN_OK;
		}
	}
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
	if (st == KILN_OK && cached[0]) {
		make_dirs(p->cache);
		cache_store(p->obj, cached);
	}
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
	pthread_t th[MAX_PARTS + 1];
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
	char *head[] = {"cc", "-shared", "-Wl,-z,defs", "-Wl,-z,noexecstack", "-Wl,--build-id=none",
	                "-Wl,--exclude-libs,ALL", "-Wl,-Bsymbolic", "-Xlinker", "-soname",
	                "-Xlinker", (char *)base, "-o", so};
	char *tail[] = {s->rt, "-lm", "-lpthread", NULL};
	enum { NHEAD = sizeof head / sizeof *head, NTAIL = sizeof tail / sizeof *tail };
	char *argv[NHEAD + MAX_PARTS + 2 + NTAIL];
	int n = 0;
	for (int i = 0; i < NHEAD; i++)
		argv[n++] = head[i];
	for (int i = 0; i < s->nparts; i++)
		argv[n++] = s->parts[i].obj;
	if (blob_obj)
		argv[n++] = (char *)blob_obj;
	for (int i = 0; i < NTAIL; i++)
		argv[n++] = tail[i];
	st = cg_run_tool(path, argv, err);
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

/* The object cache's folder (backend.h: cg_cache_dir). */
static const char *cache_dir(const kiln_compile_opts *o, char *buf, size_t size)
{
	return cg_cache_dir(o->cache_dir, buf, size);
}

const char *cg_cache_dir(const char *dir, char *buf, size_t size)
{
	const char *d = dir ? dir : getenv("KILN_CACHE_DIR");
	if (d) {
		if (!*d)
			return NULL;
		snprintf(buf, size, "%s", d);
		return buf;
	}
	const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
	if (x && *x)
		snprintf(buf, size, "%s/kiln", x);
	else if (h && *h)
		snprintf(buf, size, "%s/.cache/kiln", h);
	else
		return NULL;
	return buf;
}

static kiln_status s_open(cg_session **out, const cg_library *lib, kiln_error *err)
{
	cg_session *s = calloc(1, sizeof *s);
	if (!s)
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	s->lib = lib;
	pthread_mutex_init(&s->lock, NULL);
	int n = 1;
	bool helpers = false;
	/* no runtime, no library: say so before the LLVM work, not after */
	if (linking(lib)) {
		kiln_status st = cg_runtime_archive(s->rt, sizeof s->rt, err);
		if (st != KILN_OK) {
			pthread_mutex_destroy(&s->lock);
			free(s);
			return st;
		}
		n = cg_llvm_parts_for(lib->m, MAX_PARTS);
		int ne = cg_llvm_parts_for(lib->eval, MAX_PARTS);
		n = ne > n ? ne : n;
		helpers = cg_llvm_uses_helpers(lib->m) || cg_llvm_uses_helpers(lib->eval);
	}
	s->nkparts = n;
	s->parts = calloc((size_t)n + 1, sizeof *s->parts);
	if (!s->parts) {
		free(s);
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	}
	kiln_status st = KILN_OK;
	for (int i = 0; i < n + helpers && st == KILN_OK; i++) {
		part *p = &s->parts[i];
		st = cg_target_init(&p->t, lib->o->cpu, lib->o->features, err);
		if (st != KILN_OK)
			break;
		s->nparts++;
		/* the helpers' module is named alike in every library: its object
		 * depends on the target only, and is cached */
		llvm_open(&p->L, &p->t, lib->m, i < n ? lib->name : "kiln_helpers", &p->d);
		p->L.helpers_extern = helpers && i < n;
		p->L.blob = i == 0 && linking(lib) ? &s->blob : NULL;
		p->cache = i == n ? cache_dir(lib->o, s->cache_buf, sizeof s->cache_buf) : NULL;
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
	for (int p = 0; p < s->nkparts; p++)
		parts[p] = &s->parts[p].L;
	return cg_llvm_emit_kernels(parts, s->nkparts, m, i, s->fns[i], err);
}

static kiln_status s_library(cg_session *s, kiln_error *err)
{
	if (s->nparts > s->nkparts) { /* both helpers, whatever the kernels use */
		cg_llvm *LH = &s->parts[s->nkparts].L;
		cg_llvm_sgemm(LH);
		cg_llvm_transpose(LH);
		if (cg_llvm_uses_sgemm_pb(s->lib->m, false) || cg_llvm_uses_sgemm_pb(s->lib->eval, false))
			cg_llvm_sgemm_pb(LH);
		if (cg_llvm_uses_sgemm_pb(s->lib->m, true) || cg_llvm_uses_sgemm_pb(s->lib->eval, true))
			cg_llvm_sgemm_pbw(LH);
		int pa = cg_sgemm_a_panel(LH->t), pm = cg_sgemm_m_panel(LH->t, NULL, NULL);
		if (cg_llvm_uses_a_panels(s->lib->m, pa) || cg_llvm_uses_a_panels(s->lib->eval, pa))
			cg_llvm_sgemm_pa(LH);
		if (pm && (cg_llvm_uses_a_panels(s->lib->m, pm) || cg_llvm_uses_a_panels(s->lib->eval, pm)))
			cg_llvm_sgemm_pm(LH);
		cg_llvm_export_helpers(LH);
	}
	return cg_llvm_library(&s->parts[0].L, s->lib, s->fns, err);
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
	part *h = s->nparts > s->nkparts ? &s->parts[s->nkparts] : NULL;
	if (st != KILN_OK && h && h->cached) {
		/* a damaged cached object: compile the helpers after all, put
		 * the new object in the cache, link again */
		kiln_error e2 = {0};
		char bad[4200];
		snprintf(bad, sizeof bad, "%s", h->obj);
		h->cached = false;
		h->obj[0] = 0;
		unlink(bad);
		st = finish_part(h, "so", path, &e2);
		if (st == KILN_OK)
			st = link_so(s, blob_obj[0] ? blob_obj : NULL, path, err);
		else
			*err = e2;
	}
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
			tm->cached += s->parts[i].cached;
		}
	}
	return st;
}

static void s_close(cg_session *s)
{
	for (int i = 0; i < s->nparts; i++) {
		part *p = &s->parts[i];
		if (p->obj[0] && !p->cached)
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

static kiln_status gemm_panel(const kiln_compile_opts *o, cg_panels *p, kiln_error *err)
{
	cg_target t;
	kiln_status st = cg_target_init(&t, o ? o->cpu : NULL, o ? o->features : NULL, err);
	if (st != KILN_OK)
		return st;
	p->a = cg_sgemm_a_panel(&t);
	p->a_lanes = cg_sgemm_m_panel(&t, &p->a_lanes_max_n, &p->a_lanes_min_k);
	p->c_block = p->a_lanes ? cg_sgemm_c_block(&t, &p->c_block_max_n) : 0;
	p->b = cg_sgemm_panel(&t);
	p->b_wide = cg_sgemm_wide_panel(&t);
	cg_target_free(&t);
	return KILN_OK;
}

const cg_backend cg_llvm_backend = {
	.name = "llvm",
	.stages = stages,
	.supports = cg_llvm_supports,
	.open = s_open,
	.emit_kernels = s_kernels,
	.emit_library = s_library,
	.write = s_write,
	.close = s_close,
	.gemm_panel = gemm_panel,
};

/* Everything besides the graph that decides a library's bytes: the target
 * (triple, CPU, features, vector width), LLVM's and kiln's versions, the
 * pipeline, and the identity (size, mtime, inode) of the file holding this
 * compiler and of the runtime archive it links, since KILN_VERSION does not
 * change with every build. */
kiln_status cg_build_identity(const kiln_compile_opts *o, char *buf, size_t size,
                              kiln_error *err)
{
	cg_target t;
	kiln_status st = cg_target_init(&t, o ? o->cpu : NULL, o ? o->features : NULL, err);
	if (st != KILN_OK)
		return st;
	Dl_info dl = {0};
	struct stat self = {0}, rt = {0};
	if (!dladdr((void *)cg_build_identity, &dl) || !dl.dli_fname || stat(dl.dli_fname, &self))
		stat("/proc/self/exe", &self);
	const char *rtlib = getenv("KILN_RT_LIB");
	rtlib = rtlib && *rtlib ? rtlib : KILN_RT_GEN_LIB;
	stat(rtlib, &rt);
	snprintf(buf, size, "%s|%s|%s|%d|%s|%s|%s|%lld.%ld.%llu|%s|%lld.%ld.%llu", t.triple,
	         t.cpu, t.features, t.prefer_bits, LLVM_VERSION_STRING, KILN_VERSION, PIPELINE,
	         (long long)self.st_size, (long)self.st_mtim.tv_sec * 1000000000L +
	         self.st_mtim.tv_nsec, (unsigned long long)self.st_ino, rtlib,
	         (long long)rt.st_size, (long)rt.st_mtim.tv_sec * 1000000000L + rt.st_mtim.tv_nsec,
	         (unsigned long long)rt.st_ino);
	cg_target_free(&t);
	return KILN_OK;
}
