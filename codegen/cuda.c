/*
 * cuda.c: kernel IR printed as CUDA C (cg_cuda_print), the text the CUDA
 * backend (cuda_emit.c) compiles with NVRTC.  One printer of the same
 * kernel IR the LLVM backend reads, not a second lowering: every
 * expression and statement has one CUDA C form whose semantics are
 * keval.c's (codegen.h's contract).
 *
 * Mapping (the simple, correct one first):
 * - A kernel's body is split into launches at its top level: each
 *   CG_PARALLEL loop is a launch whose iterations are spread over the grid
 *   (a grid-stride loop, 256 threads a block); a top-level CG_GEMM is a
 *   launch of the shared-memory tiled GEMM (16x16 tiles, one C element a
 *   thread, batch on grid z); a top-level CG_TRANSPOSE one thread an
 *   element; runs of other statements are one launch of one thread.  When
 *   a local assigned at the top level is read by another launch, the
 *   whole kernel is one one-thread launch instead.  A GEMM or transposition
 *   nested in a loop runs in the thread that reaches it (kiln_gemm_serial).
 * - Launches of one kernel, and kernels, run in order on one stream.
 * - Each launch is `extern "C" __global__ void kiln_<k>_<l>(kiln_sizes S,
 *   kiln_fault *F, T *b<id>...)`, the buffers it touches by id; the grid
 *   of each comes from kiln_grid_<k>_<l>(sym, grid[3]), host code printed
 *   from the same expressions.
 * - Integer arithmetic wraps (done in unsigned 64 bits, then converted);
 *   float max/min propagate NaN; float -> integer casts saturate with
 *   NaN -> 0; f16/bf16 are bit patterns (unsigned short) converted with
 *   round to nearest even; bools are one byte in memory.
 * - CG_CHECK calls kiln_check(F, id, ...): the first failure wins
 *   (atomicCAS); the host reads it after the kernel, id indexing the
 *   table of messages kiln_what[].
 *
 * With KILN_CUDA_EMULATE defined the same text is C++ for the host: the
 * prelude defines blockIdx & co. as thread-local variables, a launch is a
 * loop over blocks and threads, and each kernel gets kiln_run_<k>(rt_exec *)
 * (runtime/model.h), so a library of emulated kernels runs under the
 * ordinary driver and is checked against the interpreter (tests).  Only
 * the tiled GEMM differs there: it is the plain per-element loop, since a
 * __syncthreads() tile cannot run thread after thread.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda.h"

/* the prelude's kiln_ld/kiln_stv know the dtypes by number */
_Static_assert(KILN_F32 == 1 && KILN_F64 == 2 && KILN_F16 == 3 && KILN_BF16 == 4 &&
               KILN_I8 == 5 && KILN_U8 == 6 && KILN_I32 == 7 && KILN_I64 == 8 &&
               KILN_BOOL == 9, "kiln_dtype numbering changed: update cuda.c's prelude");

/* ---- the prelude ---------------------------------------------------------- */

static const char prelude[] =
"#ifndef KILN_CUDA_PRELUDE\n"
"#define KILN_CUDA_PRELUDE\n"
"#ifdef KILN_CUDA_HOST /* the host side of a CUDA library: grids and launches */\n"
"typedef long long kiln_i64;\n"
"typedef unsigned long long kiln_u64;\n"
"typedef struct kiln_sizes { kiln_i64 s[KILN_MAX_SYM]; } kiln_sizes;\n"
"typedef struct kiln_host kiln_host;\n"
"static int kiln_host_launch(kiln_host *h, int fn, const unsigned g[3], unsigned threads, void **args);\n"
"static void *kiln_host_fault(kiln_host *h);\n"
"#else\n"
"typedef signed char kiln_i8;\n"
"typedef unsigned char kiln_u8;\n"
"typedef int kiln_i32;\n"
"typedef unsigned short kiln_f16; /* bits */\n"
"typedef unsigned short kiln_bf16; /* bits */\n"
"#ifdef KILN_CUDA_EMULATE\n"
"#include <math.h>\n"
"#include <stdint.h>\n"
"#include <string.h>\n"
"typedef int64_t kiln_i64;\n"
"typedef uint64_t kiln_u64;\n"
"#define _Atomic /* C11 only; rt_fault is never touched here */\n"
"extern \"C\" {\n"
"#include \"runtime/model.h\"\n"
"}\n"
"#undef _Atomic\n"
"struct kiln_dim3 { unsigned x, y, z; };\n"
"static thread_local kiln_dim3 blockIdx, threadIdx, blockDim, gridDim;\n"
"#define KILN_KERNEL static\n"
"#define __device__\n"
"#define __forceinline__ inline\n"
"#define __restrict__ __restrict\n"
"static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }\n"
"static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }\n"
"typedef struct kiln_fault { rt_exec *x; const char *const *what; } kiln_fault;\n"
"static inline void kiln_check(kiln_fault *F, int id, kiln_i64 v, kiln_i64 lo, kiln_i64 hi)\n"
"{ rt_out_of_range(F->x, F->what[id], v, lo, hi); }\n"
"template <class Fn> static void kiln_launch(const unsigned g[3], unsigned threads, Fn fn)\n"
"{\n"
"\tgridDim = {g[0], g[1], g[2]}; blockDim = {threads, threads == 256 ? 1u : threads, 1};\n"
"\tfor (unsigned z = 0; z < g[2]; z++) for (unsigned y = 0; y < g[1]; y++)\n"
"\tfor (unsigned x = 0; x < g[0]; x++) {\n"
"\t\tblockIdx = {x, y, z};\n"
"\t\tfor (unsigned ty = 0; ty < blockDim.y; ty++) for (unsigned tx = 0; tx < blockDim.x; tx++) {\n"
"\t\t\tthreadIdx = {tx, ty, 0}; fn();\n"
"\t\t}\n"
"\t}\n"
"}\n"
"#else\n"
"typedef long long kiln_i64;\n"
"typedef unsigned long long kiln_u64;\n"
"#define KILN_KERNEL extern \"C\" __global__\n"
"/* the first failed check of a run: set, check id, value, lo, hi */\n"
"typedef struct kiln_fault { int set, id; kiln_i64 v, lo, hi; } kiln_fault;\n"
"__device__ inline void kiln_check(kiln_fault *F, int id, kiln_i64 v, kiln_i64 lo, kiln_i64 hi)\n"
"{\n"
"\tif (atomicCAS(&F->set, 0, 1) == 0) { F->id = id; F->v = v; F->lo = lo; F->hi = hi; }\n"
"}\n"
"#endif\n"
"#define KILN_INF __int_as_float(0x7f800000)\n"
"#define KILN_NAN __int_as_float(0x7fc00000)\n"
"typedef struct kiln_sizes { kiln_i64 s[KILN_MAX_SYM]; } kiln_sizes;\n"
"template <class T> __device__ __forceinline__ T kmin(T a, T b) { return a < b ? a : b; }\n"
"template <class T> __device__ __forceinline__ T kmax(T a, T b) { return a > b ? a : b; }\n"
"/* float max and min propagate NaN (codegen.h) */\n"
"template <> __device__ __forceinline__ float kmin<float>(float a, float b) { return (a < b || a != a) ? a : b; }\n"
"template <> __device__ __forceinline__ float kmax<float>(float a, float b) { return (a > b || a != a) ? a : b; }\n"
"template <> __device__ __forceinline__ double kmin<double>(double a, double b) { return (a < b || a != a) ? a : b; }\n"
"template <> __device__ __forceinline__ double kmax<double>(double a, double b) { return (a > b || a != a) ? a : b; }\n"
"__device__ __forceinline__ float ksigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n"
"__device__ __forceinline__ double ksigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }\n"
"/* float -> integer: toward zero, saturated, NaN -> 0 */\n"
"__device__ __forceinline__ kiln_i64 ksat(double x, double lo, double hi)\n"
"{ return x != x ? 0 : x <= lo ? (kiln_i64)lo : x >= hi ? (kiln_i64)hi : (kiln_i64)x; }\n"
"__device__ __forceinline__ kiln_i64 ksat64(double x)\n"
"{ return x != x ? 0 : x <= -9223372036854775808.0 ? (kiln_i64)(-9223372036854775807LL - 1)\n"
"  : x >= 9223372036854775808.0 ? 9223372036854775807LL : (kiln_i64)x; }\n"
"__device__ __forceinline__ kiln_i64 kpowi(kiln_i64 a, kiln_i64 b) { return (kiln_i64)pow((double)a, (double)b); }\n"
"__device__ __forceinline__ kiln_i64 kabs(kiln_i64 a) { return a < 0 ? (kiln_i64)(0 - (kiln_u64)a) : a; }\n"
"/* f16 and bf16: bit patterns, round to nearest even */\n"
"__device__ __forceinline__ float kh2f(kiln_f16 h)\n"
"{\n"
"\tunsigned s = (unsigned)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, b;\n"
"\tif (e == 31) b = s | 0x7f800000u | (m << 13);\n"
"\telse if (e) b = s | ((e + 112) << 23) | (m << 13);\n"
"\telse if (!m) b = s;\n"
"\telse { float f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }\n"
"\treturn __int_as_float((int)b);\n"
"}\n"
"__device__ __forceinline__ kiln_f16 kf2h(float f)\n"
"{\n"
"\tunsigned x = (unsigned)__float_as_int(f), s = (x >> 16) & 0x8000, a = x & 0x7fffffffu;\n"
"\tif (a > 0x7f800000u) return (kiln_f16)(s | 0x7e00);\n"
"\tif (a >= 0x477ff000u) return (kiln_f16)(s | 0x7c00); /* rounds to inf */\n"
"\tif (a < 0x38800000u) { /* subnormal or zero: scaled to units of 2^-24, rounded */\n"
"\t\tfloat v = __int_as_float((int)a) * 16777216.0f;\n"
"\t\treturn (kiln_f16)(s | (unsigned)rintf(v));\n"
"\t}\n"
"\tunsigned r = a + 0xfffu + ((a >> 13) & 1);\n"
"\treturn (kiln_f16)(s | ((r - 0x38000000u) >> 13));\n"
"}\n"
"__device__ __forceinline__ float kbf2f(kiln_bf16 h) { return __int_as_float((int)((unsigned)h << 16)); }\n"
"__device__ __forceinline__ kiln_bf16 kf2bf(float f)\n"
"{\n"
"\tunsigned x = (unsigned)__float_as_int(f);\n"
"\tif ((x & 0x7fffffffu) > 0x7f800000u) return (kiln_bf16)((x >> 16) | 0x40);\n"
"\treturn (kiln_bf16)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);\n"
"}\n"
"/* an f32 GEMM (codegen.h's cg_gemm, the f32 subset): strides, batch, epilogue */\n"
"typedef struct kiln_gemm_args {\n"
"\tconst float *A, *B, *bias, *res; float *C;\n"
"\tkiln_i64 M, N, K, batch, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs;\n"
"\tkiln_i64 c_off, c_bs, c_rs, bias_off, res_off, res_rs;\n"
"\tfloat alpha, beta, lo, hi;\n"
"\tint bias_axis, act, res_first;\n"
"} kiln_gemm_args;\n"
"__device__ __forceinline__ void kiln_gemm_store(const kiln_gemm_args &g, kiln_i64 b, kiln_i64 i, kiln_i64 j, float acc)\n"
"{\n"
"\tkiln_i64 ci = g.c_off + b * g.c_bs + i * g.c_rs + j;\n"
"\tfloat v = g.alpha * acc;\n"
"\tif (g.beta != 0) v += g.beta * g.C[ci];\n"
"\tif (g.bias_axis) v += g.bias[g.bias_off + (g.bias_axis == 1 ? j : i)];\n"
"\tif (g.res && g.res_first) v += g.res[g.res_off + b * g.c_bs + i * g.res_rs + j];\n"
"\tif (g.act == 1 && !(v > 0) && v == v) v = 0;\n"
"\telse if (g.act == 2 && v == v) v = v < g.lo ? g.lo : v > g.hi ? g.hi : v;\n"
"\tif (g.res && !g.res_first) v += g.res[g.res_off + b * g.c_bs + i * g.res_rs + j];\n"
"\tg.C[ci] = v;\n"
"}\n"
"/* the whole product in the calling thread (a GEMM inside a loop) */\n"
"__device__ inline void kiln_gemm_serial(const kiln_gemm_args &g)\n"
"{\n"
"\tfor (kiln_i64 b = 0; b < g.batch; b++)\n"
"\tfor (kiln_i64 i = 0; i < g.M; i++)\n"
"\tfor (kiln_i64 j = 0; j < g.N; j++) {\n"
"\t\tconst float *a = g.A + g.a_off + b * g.a_bs + i * g.a_rs;\n"
"\t\tconst float *bb = g.B + g.b_off + b * g.b_bs + j * g.b_cs;\n"
"\t\tfloat acc = 0;\n"
"\t\tfor (kiln_i64 k = 0; k < g.K; k++) acc += a[k * g.a_cs] * bb[k * g.b_rs];\n"
"\t\tkiln_gemm_store(g, b, i, j, acc);\n"
"\t}\n"
"}\n"
"/* any GEMM (codegen.h's cg_gemm, all of it: 8-bit operands, zero points,\n"
" * requantization), one C element per call, in double as keval.c does;\n"
" * dt codes are kiln_dtype's (1 f32, 2 f64, 3 f16, 4 bf16, 5 i8, 6 u8,\n"
" * 7 i32, 8 i64, 9 bool) */\n"
"__device__ __forceinline__ double kiln_ld(const void *p, int dt, kiln_i64 i)\n"
"{\n"
"\tswitch (dt) {\n"
"\tcase 1: return ((const float *)p)[i];\n"
"\tcase 2: return ((const double *)p)[i];\n"
"\tcase 3: return kh2f(((const kiln_f16 *)p)[i]);\n"
"\tcase 4: return kbf2f(((const kiln_bf16 *)p)[i]);\n"
"\tcase 5: return ((const kiln_i8 *)p)[i];\n"
"\tcase 6: case 9: return ((const kiln_u8 *)p)[i];\n"
"\tcase 7: return ((const kiln_i32 *)p)[i];\n"
"\tdefault: return (double)((const kiln_i64 *)p)[i];\n"
"\t}\n"
"}\n"
"__device__ __forceinline__ void kiln_stv(void *p, int dt, kiln_i64 i, double v)\n"
"{\n"
"\tswitch (dt) {\n"
"\tcase 1: ((float *)p)[i] = (float)v; break;\n"
"\tcase 2: ((double *)p)[i] = v; break;\n"
"\tcase 3: ((kiln_f16 *)p)[i] = kf2h((float)v); break;\n"
"\tcase 4: ((kiln_bf16 *)p)[i] = kf2bf((float)v); break;\n"
"\tcase 5: ((kiln_i8 *)p)[i] = (kiln_i8)ksat(v, -128.0, 127.0); break;\n"
"\tcase 6: ((kiln_u8 *)p)[i] = (kiln_u8)ksat(v, 0.0, 255.0); break;\n"
"\tcase 7: ((kiln_i32 *)p)[i] = (kiln_i32)ksat(v, -2147483648.0, 2147483647.0); break;\n"
"\tcase 9: ((kiln_u8 *)p)[i] = v != 0; break;\n"
"\tdefault: ((kiln_i64 *)p)[i] = ksat64(v); break;\n"
"\t}\n"
"}\n"
"typedef struct kiln_vec { const void *p; int dt, axis; kiln_i64 off; } kiln_vec;\n"
"__device__ __forceinline__ double kiln_vec_at(const kiln_vec &v, kiln_i64 i, kiln_i64 j)\n"
"{ return v.axis ? kiln_ld(v.p, v.dt, v.off + (v.axis == 1 ? j : v.axis == 2 ? i : 0)) : 0; }\n"
"typedef struct kiln_qgemm_args {\n"
"\tconst void *A, *B, *bias, *res; const kiln_i64 *brows; void *C;\n"
"\tint a_dt, b_dt, c_dt, bias_dt, res_dt;\n"
"\tkiln_i64 M, N, K, batch, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs;\n"
"\tkiln_i64 c_off, c_bs, c_rs, bias_off, res_off, res_rs;\n"
"\tdouble alpha, beta, lo, hi;\n"
"\tint bias_axis, act, res_first;\n"
"\tkiln_vec az, bz, scale, cz;\n"
"} kiln_qgemm_args;\n"
"__device__ inline void kiln_qgemm_elem(const kiln_qgemm_args &g, kiln_i64 b, kiln_i64 i, kiln_i64 j)\n"
"{\n"
"\tdouble acc = 0, az = kiln_vec_at(g.az, i, j), bz = kiln_vec_at(g.bz, i, j);\n"
"\tfor (kiln_i64 k = 0; k < g.K; k++) {\n"
"\t\tkiln_i64 bk = g.brows ? g.brows[k] : k * g.b_rs;\n"
"\t\tacc += (kiln_ld(g.A, g.a_dt, g.a_off + b * g.a_bs + i * g.a_rs + k * g.a_cs) - az) *\n"
"\t\t       (kiln_ld(g.B, g.b_dt, g.b_off + b * g.b_bs + bk + j * g.b_cs) - bz);\n"
"\t}\n"
"\tkiln_i64 ci = g.c_off + b * g.c_bs + i * g.c_rs + j;\n"
"\tacc *= g.alpha;\n"
"\tif (g.beta != 0) acc += g.beta * kiln_ld(g.C, g.c_dt, ci);\n"
"\tif (g.bias_axis) acc += kiln_ld(g.bias, g.bias_dt, g.bias_off + (g.bias_axis == 1 ? j : i));\n"
"\tif (g.res && g.res_first) acc += kiln_ld(g.res, g.res_dt, g.res_off + b * g.c_bs + i * g.res_rs + j);\n"
"\tif (g.scale.axis) acc *= kiln_vec_at(g.scale, i, j);\n"
"\tif (g.act == 1 && !(acc > 0) && acc == acc) acc = 0;\n"
"\telse if (g.act == 2 && acc == acc) acc = acc < g.lo ? g.lo : acc > g.hi ? g.hi : acc;\n"
"\tif (g.res && !g.res_first) acc += kiln_ld(g.res, g.res_dt, g.res_off + b * g.c_bs + i * g.res_rs + j);\n"
"\tacc += kiln_vec_at(g.cz, i, j);\n"
"\tif (g.c_dt >= 5) acc = rint(acc); /* an integer C: half to even, then saturated */\n"
"\tkiln_stv(g.C, g.c_dt, ci, acc);\n"
"}\n"
"__device__ inline void kiln_qgemm_serial(const kiln_qgemm_args &g)\n"
"{\n"
"\tfor (kiln_i64 b = 0; b < g.batch; b++)\n"
"\tfor (kiln_i64 i = 0; i < g.M; i++)\n"
"\tfor (kiln_i64 j = 0; j < g.N; j++) kiln_qgemm_elem(g, b, i, j);\n"
"}\n"
"/* one element a thread, on the tiled GEMM's grid */\n"
"/* the tiles of C (and the batch) stride over the grid, whose dims the host\n"
" * caps at 65535 */\n"
"#define KILN_TILES(g) \\\n"
"\tfor (kiln_i64 b = blockIdx.z; b < g.batch; b += gridDim.z) \\\n"
"\tfor (kiln_i64 ti = blockIdx.y; ti * 16 < g.M; ti += gridDim.y) \\\n"
"\tfor (kiln_i64 tj = blockIdx.x; tj * 16 < g.N; tj += gridDim.x)\n"
"__device__ inline void kiln_qgemm_grid(const kiln_qgemm_args &g)\n"
"{\n"
"\tKILN_TILES(g) {\n"
"\t\tkiln_i64 i = ti * 16 + threadIdx.y, j = tj * 16 + threadIdx.x;\n"
"\t\tif (i < g.M && j < g.N) kiln_qgemm_elem(g, b, i, j);\n"
"\t}\n"
"}\n"
"#define KILN_TILE 16\n"
"#ifdef KILN_CUDA_EMULATE\n"
"/* emulated: each thread its element, the plain sum (no shared tiles) */\n"
"static void kiln_gemm_tiled(const kiln_gemm_args &g)\n"
"{\n"
"\tKILN_TILES(g) {\n"
"\t\tkiln_i64 i = ti * KILN_TILE + threadIdx.y, j = tj * KILN_TILE + threadIdx.x;\n"
"\t\tif (i >= g.M || j >= g.N) continue;\n"
"\t\tconst float *a = g.A + g.a_off + b * g.a_bs + i * g.a_rs;\n"
"\t\tconst float *bb = g.B + g.b_off + b * g.b_bs + j * g.b_cs;\n"
"\t\tfloat acc = 0;\n"
"\t\tfor (kiln_i64 k = 0; k < g.K; k++) acc += a[k * g.a_cs] * bb[k * g.b_rs];\n"
"\t\tkiln_gemm_store(g, b, i, j, acc);\n"
"\t}\n"
"}\n"
"#else\n"
"/* 16x16 tiles of A and B through shared memory, one C element a thread,\n"
" * f32 sums in k order (strict f32); batch on grid z */\n"
"__device__ inline void kiln_gemm_tiled(const kiln_gemm_args &g)\n"
"{\n"
"\t__shared__ float As[KILN_TILE][KILN_TILE], Bs[KILN_TILE][KILN_TILE + 1];\n"
"\tkiln_i64 ty = threadIdx.y, tx = threadIdx.x;\n"
"\tKILN_TILES(g) { /* uniform over the block: __syncthreads() is safe */\n"
"\t\tkiln_i64 i = ti * KILN_TILE + ty, j = tj * KILN_TILE + tx;\n"
"\t\tconst float *A = g.A + g.a_off + b * g.a_bs, *B = g.B + g.b_off + b * g.b_bs;\n"
"\t\tfloat acc = 0;\n"
"\t\tfor (kiln_i64 k0 = 0; k0 < g.K; k0 += KILN_TILE) {\n"
"\t\t\tkiln_i64 ka = k0 + tx, kb = k0 + ty;\n"
"\t\t\tAs[ty][tx] = i < g.M && ka < g.K ? A[i * g.a_rs + ka * g.a_cs] : 0.0f;\n"
"\t\t\tBs[ty][tx] = j < g.N && kb < g.K ? B[kb * g.b_rs + j * g.b_cs] : 0.0f;\n"
"\t\t\t__syncthreads();\n"
"\t\t\tkiln_i64 kn = g.K - k0 < KILN_TILE ? g.K - k0 : KILN_TILE;\n"
"\t\t\tfor (kiln_i64 k = 0; k < kn; k++) acc += As[ty][k] * Bs[k][tx];\n"
"\t\t\t__syncthreads();\n"
"\t\t}\n"
"\t\tif (i < g.M && j < g.N) kiln_gemm_store(g, b, i, j, acc);\n"
"\t}\n"
"}\n"
"#endif\n"
"#endif /* KILN_CUDA_HOST */\n"
"#endif /* KILN_CUDA_PRELUDE */\n";

/* ---- text --------------------------------------------------------------------- */

typedef struct pr {
	const cg_module *m;
	FILE *f;
	bool host;       /* sizes read from sym[] (host code), else S.s[] */
	int nchecks;     /* CG_CHECKs numbered in print order */
	const char **what;
	int capwhat;
	bool oom;
	const char *pre; /* names: <pre>_<k>_<l>, <pre>_grid_..., <pre>_what */
	char **launch;   /* every launch's kernel name, in order */
	int nlaunch, caplaunch;
} pr;

static void add_launch(pr *p, char *name)
{
	if (p->nlaunch == p->caplaunch) {
		int cap = p->caplaunch ? 2 * p->caplaunch : 16;
		char **l = realloc(p->launch, (size_t)cap * sizeof *l);
		if (!l) {
			free(name);
			p->oom = true;
			return;
		}
		p->launch = l, p->caplaunch = cap;
	}
	p->launch[p->nlaunch++] = name;
}

static const char *ctype(kiln_dtype dt)
{
	switch (dt) {
	case KILN_F32: return "float";
	case KILN_F64: return "double";
	case KILN_I8: return "kiln_i8";
	case KILN_U8: return "kiln_u8";
	case KILN_I32: return "kiln_i32";
	case KILN_I64: return "kiln_i64";
	case KILN_BOOL: return "bool";
	case KILN_F16: return "kiln_f16";
	case KILN_BF16: return "kiln_bf16";
	default: return "void";
	}
}

/* the type of a buffer's elements in memory */
static const char *mtype(kiln_dtype dt)
{
	return dt == KILN_BOOL ? "kiln_u8" : ctype(dt);
}

static bool isfl(kiln_dtype dt)
{
	return kiln_dtype_is_float(dt);
}

static bool is16(kiln_dtype dt)
{
	return dt == KILN_F16 || dt == KILN_BF16;
}

static void ex(pr *p, const cg_expr *e);

static void fconst(pr *p, double v, kiln_dtype dt)
{
	FILE *f = p->f;
	bool single = dt != KILN_F64;
	if (isnan(v))
		fprintf(f, single ? "KILN_NAN" : "(double)KILN_NAN");
	else if (isinf(v))
		fprintf(f, "%s%sKILN_INF", v < 0 ? "-" : "", single ? "" : "(double)");
	else {
		char t[40];
		snprintf(t, sizeof t - 4, single ? "%.9g" : "%.17g", single ? (double)(float)v : v);
		if (!strpbrk(t, ".e"))
			strcat(t, ".0");
		fprintf(f, "%s%s", t, single ? "f" : "");
	}
}

static void iconst(pr *p, int64_t v, kiln_dtype dt)
{
	if (dt == KILN_BOOL)
		fprintf(p->f, v ? "true" : "false");
	else if (dt == KILN_I64 && v == INT64_MIN)
		fprintf(p->f, "(-9223372036854775807LL - 1)");
	else if (dt == KILN_I64)
		fprintf(p->f, "%lldLL", (long long)v);
	else
		fprintf(p->f, "(%s)%lld", ctype(dt), (long long)v);
}

/* a float value of dt (f16/bf16: their bits) as float or double */
static void as_float(pr *p, const cg_expr *e)
{
	if (e->dt == KILN_F16 || e->dt == KILN_BF16) {
		fprintf(p->f, "%s(", e->dt == KILN_F16 ? "kh2f" : "kbf2f");
		ex(p, e);
		fprintf(p->f, ")");
	} else
		ex(p, e);
}

static void cast(pr *p, const cg_expr *e)
{
	FILE *f = p->f;
	kiln_dtype from = e->a->dt, to = e->dt;
	if (from == to) {
		ex(p, e->a);
		return;
	}
	if (to == KILN_BOOL) {
		fprintf(f, "(");
		as_float(p, e->a);
		fprintf(f, " != 0)");
		return;
	}
	if (isfl(to)) {
		if (is16(to)) {
			fprintf(f, "%s((float)(", to == KILN_F16 ? "kf2h" : "kf2bf");
			as_float(p, e->a);
			fprintf(f, "))");
		} else {
			fprintf(f, "((%s)(", ctype(to));
			as_float(p, e->a);
			fprintf(f, "))");
		}
		return;
	}
	if (isfl(from)) { /* saturating */
		static const struct { kiln_dtype dt; const char *lo, *hi; } r[] = {
			{KILN_I8, "-128.0", "127.0"}, {KILN_U8, "0.0", "255.0"},
			{KILN_I32, "-2147483648.0", "2147483647.0"}};
		for (size_t i = 0; i < sizeof r / sizeof *r; i++)
			if (r[i].dt == to) {
				fprintf(f, "((%s)ksat((double)(", ctype(to));
				as_float(p, e->a);
				fprintf(f, "), %s, %s))", r[i].lo, r[i].hi);
				return;
			}
		fprintf(f, "ksat64((double)(");
		as_float(p, e->a);
		fprintf(f, "))");
		return;
	}
	fprintf(f, "((%s)(", ctype(to)); /* integer -> integer wraps */
	ex(p, e->a);
	fprintf(f, "))");
}

static const char *unf32[CG_UNOP_COUNT] = {
	[CG_ABS] = "fabsf", [CG_EXP] = "expf", [CG_LOG] = "logf", [CG_SQRT] = "sqrtf",
	[CG_TANH] = "tanhf", [CG_ERF] = "erff", [CG_SIN] = "sinf", [CG_COS] = "cosf",
	[CG_FLOOR] = "floorf", [CG_CEIL] = "ceilf", [CG_ROUND] = "rintf", [CG_ATAN] = "atanf",
	[CG_ASIN] = "asinf", [CG_ACOS] = "acosf", [CG_SIGMOID] = "ksigmoid"};
static const char *unf64[CG_UNOP_COUNT] = {
	[CG_ABS] = "fabs", [CG_EXP] = "exp", [CG_LOG] = "log", [CG_SQRT] = "sqrt",
	[CG_TANH] = "tanh", [CG_ERF] = "erf", [CG_SIN] = "sin", [CG_COS] = "cos",
	[CG_FLOOR] = "floor", [CG_CEIL] = "ceil", [CG_ROUND] = "rint", [CG_ATAN] = "atan",
	[CG_ASIN] = "asin", [CG_ACOS] = "acos", [CG_SIGMOID] = "ksigmoid"};

static void un(pr *p, const cg_expr *e)
{
	FILE *f = p->f;
	if (isfl(e->dt)) {
		if (e->op == CG_NEG) {
			fprintf(f, "(-");
			ex(p, e->a);
			fprintf(f, ")");
			return;
		}
		const char *fn = e->dt == KILN_F64 ? unf64[e->op] : unf32[e->op];
		fprintf(f, "%s(", fn ? fn : "?");
		ex(p, e->a);
		fprintf(f, ")");
		return;
	}
	switch (e->op) {
	case CG_NEG:
		fprintf(f, "((%s)(0ULL - (kiln_u64)(", ctype(e->dt));
		ex(p, e->a);
		fprintf(f, ")))");
		break;
	case CG_ABS:
		fprintf(f, "((%s)kabs(", ctype(e->dt));
		ex(p, e->a);
		fprintf(f, "))");
		break;
	case CG_NOT:
		fprintf(f, "(!");
		ex(p, e->a);
		fprintf(f, ")");
		break;
	default: ex(p, e->a);
	}
}

static void call2(pr *p, const char *fn, const cg_expr *e)
{
	fprintf(p->f, "%s(", fn);
	ex(p, e->a);
	fprintf(p->f, ", ");
	ex(p, e->b);
	fprintf(p->f, ")");
}

static void infix(pr *p, const char *op, const cg_expr *e)
{
	fprintf(p->f, "(");
	ex(p, e->a);
	fprintf(p->f, " %s ", op);
	ex(p, e->b);
	fprintf(p->f, ")");
}

static const char *const binop_c[CG_BINOP_COUNT] = {
	[CG_ADD] = "+", [CG_SUB] = "-", [CG_MUL] = "*", [CG_DIV] = "/", [CG_REM] = "%",
	[CG_EQ] = "==", [CG_NE] = "!=", [CG_LT] = "<", [CG_LE] = "<=", [CG_GT] = ">",
	[CG_GE] = ">=", [CG_AND] = "&&", [CG_OR] = "||", [CG_XOR] = "^"};

/* Index arithmetic (i64 over loop variables, sizes and constants below
 * 2^31, no loads) cannot overflow in the nests the lowering makes
 * (codegen.h: indices are non-negative) and is printed as plain C; any
 * other integer + - * wraps explicitly (Dropout's hash). */
static bool plain(const cg_expr *e)
{
	if (!e)
		return true;
	switch (e->kind) {
	case CG_CONST: return e->i > -(INT64_C(1) << 31) && e->i < (INT64_C(1) << 31);
	case CG_VAR:
	case CG_SIZE: return e->dt == KILN_I64;
	case CG_BIN:
		return e->dt == KILN_I64 && e->op != CG_XOR && e->op != CG_SHR && plain(e->a) &&
		       plain(e->b);
	case CG_SELECT: return plain(e->b) && plain(e->c);
	default: return false;
	}
}

static void bin(pr *p, const cg_expr *e)
{
	FILE *f = p->f;
	kiln_dtype dt = e->a->dt;
	char fn[64];
	switch (e->op) {
	case CG_MIN:
	case CG_MAX:
		snprintf(fn, sizeof fn, "%s<%s>", e->op == CG_MIN ? "kmin" : "kmax", ctype(dt));
		call2(p, fn, e);
		return;
	case CG_POW:
		call2(p, isfl(dt) ? dt == KILN_F64 ? "pow" : "powf" : "kpowi", e);
		return;
	case CG_REM:
		if (isfl(dt)) {
			call2(p, dt == KILN_F64 ? "fmod" : "fmodf", e);
			return;
		}
		break;
	case CG_SHR:
		fprintf(f, "((kiln_i64)((kiln_u64)(");
		ex(p, e->a);
		fprintf(f, ") >> (");
		ex(p, e->b);
		fprintf(f, ")))");
		return;
	case CG_ADD:
	case CG_SUB:
	case CG_MUL:
		if (dt == KILN_I64 && plain(e)) {
			infix(p, binop_c[e->op], e);
			return;
		}
		if (!isfl(dt)) { /* wraps: in unsigned 64 bits, then converted */
			fprintf(f, "((%s)((kiln_u64)(", ctype(e->dt));
			ex(p, e->a);
			fprintf(f, ") %s (kiln_u64)(", binop_c[e->op]);
			ex(p, e->b);
			fprintf(f, ")))");
			return;
		}
		break;
	default: break;
	}
	if (!isfl(dt) && (e->op == CG_DIV || e->op == CG_REM || e->op == CG_XOR)) {
		fprintf(f, "((%s)", ctype(e->dt));
		infix(p, binop_c[e->op], e);
		fprintf(f, ")");
		return;
	}
	infix(p, binop_c[e->op] ? binop_c[e->op] : "?", e);
}

static void ex(pr *p, const cg_expr *e)
{
	FILE *f = p->f;
	if (!e) {
		fprintf(f, "0");
		return;
	}
	switch (e->kind) {
	case CG_CONST:
		if (is16(e->dt)) {
			fprintf(f, "%s(", e->dt == KILN_F16 ? "kf2h" : "kf2bf");
			fconst(p, e->f, KILN_F32);
			fprintf(f, ")");
		} else if (isfl(e->dt))
			fconst(p, e->f, e->dt);
		else
			iconst(p, e->i, e->dt);
		break;
	case CG_VAR: fprintf(f, "v%d", e->var); break;
	case CG_SIZE: fprintf(f, p->host ? "sym[%d]" : "S.s[%d]", e->var); break;
	case CG_LOAD:
		fprintf(f, e->dt == KILN_BOOL ? "(b%d[" : "b%d[", e->buf);
		ex(p, e->a);
		fprintf(f, e->dt == KILN_BOOL ? "] != 0)" : "]");
		break;
	case CG_UN: un(p, e); break;
	case CG_BIN: bin(p, e); break;
	case CG_SELECT:
		fprintf(f, "(");
		ex(p, e->a);
		fprintf(f, " ? ");
		ex(p, e->b);
		fprintf(f, " : ");
		ex(p, e->c);
		fprintf(f, ")");
		break;
	case CG_CAST: cast(p, e); break;
	}
}

/* ---- statements ------------------------------------------------------------- */

static void ind(pr *p, int d)
{
	for (int i = 0; i < d; i++)
		fputc('\t', p->f);
}

static bool is_f32_gemm(const cg_gemm *g)
{
	return cg_gemm_is_f32(g) && !g->has_b_rows && !g->a_panel && !g->b_panel;
}

static void vec_arg(pr *p, const char *name, const cg_gemm_vec *v, int d)
{
	if (!v->axis)
		return;
	ind(p, d);
	fprintf(p->f, "g.%s.p = b%d; g.%s.dt = %d; g.%s.axis = %d; g.%s.off = ", name, v->buf, name,
	        (int)p->m->buf[v->buf].dt, name, v->axis, name);
	ex(p, v->off);
	fprintf(p->f, ";\n");
}

static void gemm_args(pr *p, const cg_gemm *g, int d)
{
	FILE *f = p->f;
	bool q = !is_f32_gemm(g);
	struct { const char *name; const cg_expr *e; } x[] = {
		{"M", g->M}, {"N", g->N}, {"K", g->K}, {"batch", g->batch},
		{"a_off", g->a_off}, {"a_bs", g->a_bs}, {"a_rs", g->a_rs}, {"a_cs", g->a_cs},
		{"b_off", g->b_off}, {"b_bs", g->b_bs}, {"b_rs", g->b_rs}, {"b_cs", g->b_cs},
		{"c_off", g->c_off}, {"c_bs", g->c_bs}, {"c_rs", g->c_rs},
		{"bias_off", g->bias_off}, {"res_off", g->res_off}, {"res_rs", g->res_rs}};
	const cg_buf *B = p->m->buf;
	ind(p, d);
	fprintf(f, "kiln_%sgemm_args g = {};\n", q ? "q" : "");
	ind(p, d);
	fprintf(f, "g.A = b%d; g.B = b%d; g.C = b%d;", g->a, g->b, g->c);
	if (g->bias_axis && g->bias >= 0)
		fprintf(f, " g.bias = b%d;", g->bias);
	if (g->has_residual)
		fprintf(f, " g.res = b%d;", g->residual);
	fprintf(f, "\n");
	if (q) {
		ind(p, d);
		fprintf(f, "g.a_dt = %d; g.b_dt = %d; g.c_dt = %d; g.bias_dt = %d; g.res_dt = %d;\n",
		        (int)B[g->a].dt, (int)B[g->b].dt, (int)B[g->c].dt,
		        g->bias >= 0 ? (int)B[g->bias].dt : 0,
		        g->has_residual ? (int)B[g->residual].dt : 0);
		if (g->has_b_rows) {
			ind(p, d);
			fprintf(f, "g.brows = b%d;\n", g->b_rows);
		}
		vec_arg(p, "az", &g->a_zero, d), vec_arg(p, "bz", &g->b_zero, d);
		vec_arg(p, "scale", &g->scale, d), vec_arg(p, "cz", &g->c_zero, d);
	}
	for (size_t i = 0; i < sizeof x / sizeof *x; i++) {
		if (!x[i].e)
			continue;
		ind(p, d);
		fprintf(f, "g.%s = ", x[i].name);
		ex(p, x[i].e);
		fprintf(f, ";\n");
	}
	ind(p, d);
	fprintf(f, "g.alpha = ");
	fconst(p, g->alpha, q ? KILN_F64 : KILN_F32);
	fprintf(f, "; g.beta = ");
	fconst(p, g->beta, q ? KILN_F64 : KILN_F32);
	fprintf(f, "; g.bias_axis = %d; g.act = %d; g.res_first = %d;\n",
	        g->bias >= 0 ? g->bias_axis : 0, (int)g->act, g->res_first ? 1 : 0);
	if (g->act == CG_ACT_CLIP) {
		ind(p, d);
		fprintf(f, "g.lo = ");
		fconst(p, g->act_lo, q ? KILN_F64 : KILN_F32);
		fprintf(f, "; g.hi = ");
		fconst(p, g->act_hi, q ? KILN_F64 : KILN_F32);
		fprintf(f, ";\n");
	}
}

/* Element (i, j) of a transposition: "b<dst>[dst_off + j * dst_rs + i] =
 * b<src>[src_off + i * src_rs + j]", the statement's and the launch's. */
static void transpose_move(pr *p, const cg_transpose *t)
{
	FILE *f = p->f;
	fprintf(f, "b%d[", t->dst);
	ex(p, t->dst_off);
	fprintf(f, " + j * ");
	ex(p, t->dst_rs);
	fprintf(f, " + i] = b%d[", t->src);
	ex(p, t->src_off);
	fprintf(f, " + i * ");
	ex(p, t->src_rs);
	fprintf(f, " + j]");
}

static int add_what(pr *p, const char *what)
{
	if (p->nchecks == p->capwhat) {
		int cap = p->capwhat ? 2 * p->capwhat : 16;
		const char **w = realloc(p->what, (size_t)cap * sizeof *w);
		if (!w) {
			p->oom = true;
			return 0;
		}
		p->what = w, p->capwhat = cap;
	}
	p->what[p->nchecks] = what ? what : "check";
	return p->nchecks++;
}

static void st(pr *p, const cg_stmt *s, int d)
{
	FILE *f = p->f;
	if (!s)
		return;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			st(p, s->items[i], d);
		break;
	case CG_FOR:
		ind(p, d);
		fprintf(f, "for (kiln_i64 v%d = 0, n%d = ", s->var, s->var);
		ex(p, s->extent);
		fprintf(f, "; v%d < n%d; v%d++) {\n", s->var, s->var, s->var);
		st(p, s->body, d + 1);
		ind(p, d);
		fprintf(f, "}\n");
		break;
	case CG_STORE: {
		kiln_dtype bdt = p->m->buf[s->buf].dt;
		ind(p, d);
		fprintf(f, "b%d[", s->buf);
		ex(p, s->index);
		fprintf(f, "] = ");
		if (s->value->dt == bdt && bdt != KILN_BOOL)
			ex(p, s->value);
		else {
			fprintf(f, "(%s)(", mtype(bdt));
			ex(p, s->value);
			fprintf(f, ")");
		}
		fprintf(f, ";\n");
		break;
	}
	case CG_ASSIGN:
		ind(p, d);
		fprintf(f, "v%d = ", s->var);
		ex(p, s->value);
		fprintf(f, ";\n");
		break;
	case CG_IF:
		ind(p, d);
		fprintf(f, "if (");
		ex(p, s->cond);
		fprintf(f, ") {\n");
		st(p, s->then_s, d + 1);
		ind(p, d);
		if (s->else_s) {
			fprintf(f, "} else {\n");
			st(p, s->else_s, d + 1);
			ind(p, d);
		}
		fprintf(f, "}\n");
		break;
	case CG_GEMM:
		ind(p, d);
		fprintf(f, "{\n");
		gemm_args(p, s->gemm, d + 1);
		ind(p, d + 1);
		fprintf(f, "kiln_%sgemm_serial(g);\n", is_f32_gemm(s->gemm) ? "" : "q");
		ind(p, d);
		fprintf(f, "}\n");
		break;
	case CG_TRANSPOSE: {
		const cg_transpose *t = s->tr;
		ind(p, d);
		fprintf(f, "for (kiln_i64 i = 0, R = ");
		ex(p, t->rows);
		fprintf(f, "; i < R; i++)\n");
		ind(p, d + 1);
		fprintf(f, "for (kiln_i64 j = 0, C = ");
		ex(p, t->cols);
		fprintf(f, "; j < C; j++)\n");
		ind(p, d + 2);
		transpose_move(p, t);
		fprintf(f, ";\n");
		break;
	}
	case CG_CHECK: {
		int id = add_what(p, s->what);
		ind(p, d);
		if (!s->lo) {
			fprintf(f, "if (!(");
			ex(p, s->value);
			fprintf(f, ")) kiln_check(F, %d, 0, 0, 0);\n", id);
		} else {
			fprintf(f, "{ kiln_i64 cv = ");
			ex(p, s->value);
			fprintf(f, ", lo = ");
			ex(p, s->lo);
			fprintf(f, ", hi = ");
			ex(p, s->hi);
			fprintf(f, "; if (cv < lo || cv >= hi) kiln_check(F, %d, cv, lo, hi); }\n", id);
		}
		break;
	}
	}
}

/* ---- launches ----------------------------------------------------------------- */

enum { L_SERIAL, L_PARALLEL, L_GEMM, L_TRANSPOSE };

typedef struct launch {
	int kind;
	int first, n;          /* items [first, first + n) of the body */
} launch;

/* The top-level statements of a body; one holds a lone statement. */
static void body_items(const cg_stmt *body, const cg_stmt *const **items, int *n,
                       const cg_stmt **one)
{
	if (body && body->kind == CG_BLOCK) {
		*items = (const cg_stmt *const *)body->items;
		*n = body->n;
	} else {
		one[0] = body;
		*items = one;
		*n = body ? 1 : 0;
	}
}

/* uses of buffers (used[b]) and reads / writes of variables */
static void expr_uses(const cg_expr *e, bool *buf, bool *rd)
{
	if (!e)
		return;
	if (e->kind == CG_LOAD)
		buf[e->buf] = true;
	if (e->kind == CG_VAR && rd)
		rd[e->var] = true;
	expr_uses(e->a, buf, rd), expr_uses(e->b, buf, rd), expr_uses(e->c, buf, rd);
}

static void stmt_uses(const cg_stmt *s, bool *buf, bool *rd, bool *wr, kiln_dtype *vdt)
{
	if (!s)
		return;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			stmt_uses(s->items[i], buf, rd, wr, vdt);
		break;
	case CG_FOR:
		expr_uses(s->extent, buf, rd);
		stmt_uses(s->body, buf, rd, wr, vdt);
		break;
	case CG_STORE:
		buf[s->buf] = true;
		expr_uses(s->index, buf, rd), expr_uses(s->value, buf, rd);
		break;
	case CG_ASSIGN:
		if (wr)
			wr[s->var] = true;
		if (vdt)
			vdt[s->var] = s->dt;
		expr_uses(s->value, buf, rd);
		break;
	case CG_IF:
		expr_uses(s->cond, buf, rd);
		stmt_uses(s->then_s, buf, rd, wr, vdt), stmt_uses(s->else_s, buf, rd, wr, vdt);
		break;
	case CG_GEMM: {
		const cg_gemm *g = s->gemm;
		buf[g->a] = buf[g->b] = buf[g->c] = true;
		if (g->bias >= 0 && g->bias_axis)
			buf[g->bias] = true;
		if (g->has_residual)
			buf[g->residual] = true;
		if (g->has_b_rows)
			buf[g->b_rows] = true;
		const cg_gemm_vec *vs[] = {&g->scale, &g->a_zero, &g->b_zero, &g->c_zero};
		for (int i = 0; i < 4; i++)
			if (vs[i]->axis) {
				buf[vs[i]->buf] = true;
				expr_uses(vs[i]->off, buf, rd);
			}
		const cg_expr *x[] = {g->M, g->N, g->K, g->batch, g->a_off, g->a_bs, g->a_rs, g->a_cs,
		                      g->b_off, g->b_bs, g->b_rs, g->b_cs, g->c_off, g->c_bs, g->c_rs,
		                      g->bias_off, g->res_off, g->res_rs};
		for (size_t i = 0; i < sizeof x / sizeof *x; i++)
			expr_uses(x[i], buf, rd);
		break;
	}
	case CG_TRANSPOSE: {
		const cg_transpose *t = s->tr;
		buf[t->src] = buf[t->dst] = true;
		expr_uses(t->rows, buf, rd), expr_uses(t->cols, buf, rd);
		expr_uses(t->src_off, buf, rd), expr_uses(t->src_rs, buf, rd);
		expr_uses(t->dst_off, buf, rd), expr_uses(t->dst_rs, buf, rd);
		break;
	}
	case CG_CHECK:
		expr_uses(s->value, buf, rd), expr_uses(s->lo, buf, rd), expr_uses(s->hi, buf, rd);
		break;
	}
}

static bool has_check(const cg_stmt *s)
{
	if (!s)
		return false;
	if (s->kind == CG_CHECK)
		return true;
	if (s->kind == CG_BLOCK) {
		for (int i = 0; i < s->n; i++)
			if (has_check(s->items[i]))
				return true;
		return false;
	}
	return has_check(s->body) || has_check(s->then_s) || has_check(s->else_s);
}

/* The launches of k's body (at most n items of it), into L; their count. */
static int split(const cg_module *m, const cg_kernel *k, launch *L)
{
	const cg_stmt *const *it, *one[1];
	int n, nl = 0;
	body_items(k->body, &it, &n, one);
	for (int i = 0; i < n; i++) {
		const cg_stmt *s = it[i];
		int kind = s->kind == CG_FOR && (s->hints & CG_PARALLEL) ? L_PARALLEL
		           : s->kind == CG_GEMM ? L_GEMM : s->kind == CG_TRANSPOSE ? L_TRANSPOSE
		           : L_SERIAL;
		if (kind == L_SERIAL && nl && L[nl - 1].kind == L_SERIAL)
			L[nl - 1].n++;
		else
			L[nl++] = (launch){kind, i, 1};
	}
	if (nl <= 1)
		return nl;
	/* a local assigned at the top level and read by another launch: one
	 * serial launch for everything */
	int nv = k->nvar + 1;
	bool *wr = calloc((size_t)nv, 1), *rd = calloc((size_t)nv, 1);
	bool *bufs = calloc((size_t)m->nbuf + 1, 1);
	bool merge = !wr || !rd || !bufs;
	for (int l = 0; l < nl && !merge; l++) {
		memset(wr, 0, (size_t)nv);
		for (int i = L[l].first; i < L[l].first + L[l].n; i++)
			if (it[i]->kind == CG_ASSIGN)
				wr[it[i]->var] = true;
		for (int o = 0; o < nl && !merge; o++) {
			if (o == l)
				continue;
			memset(rd, 0, (size_t)nv);
			for (int i = L[o].first; i < L[o].first + L[o].n; i++)
				stmt_uses(it[i], bufs, rd, NULL, NULL);
			for (int v = 0; v < nv && !merge; v++)
				merge = wr[v] && rd[v];
		}
	}
	free(wr), free(rd), free(bufs);
	if (merge) {
		L[0] = (launch){L_SERIAL, 0, n};
		nl = 1;
	}
	return nl;
}

/* the buffers a launch touches, as its parameters */
static void params(pr *p, const bool *used)
{
	const cg_module *m = p->m;
	for (int b = 0; b < m->nbuf; b++)
		if (used[b])
			fprintf(p->f, ", %s *__restrict__ b%d", mtype(m->buf[b].dt), b);
}

static void args(pr *p, const bool *used, bool host_emu)
{
	for (int b = 0; b < p->m->nbuf; b++)
		if (used[b])
			fprintf(p->f, ", (%s *)x->buf[%d]", mtype(p->m->buf[b].dt), b);
}

static void guard(pr *p, const cg_kernel *k, int d)
{
	if (!k->guard)
		return;
	ind(p, d);
	fprintf(p->f, "if (!(");
	ex(p, k->guard);
	fprintf(p->f, ")) return;\n");
}

static void launch_body(pr *p, const cg_kernel *k, const launch *l, const cg_stmt *const *it,
                        int nv)
{
	FILE *f = p->f;
	guard(p, k, 1);
	const cg_stmt *s = it[l->first];
	if (l->kind == L_PARALLEL) {
		fprintf(f, "\tfor (kiln_i64 v%d = (kiln_i64)blockIdx.x * blockDim.x + threadIdx.x, "
		        "n%d = ", s->var, s->var);
		ex(p, s->extent);
		fprintf(f, "; v%d < n%d; v%d += (kiln_i64)gridDim.x * blockDim.x) {\n", s->var,
		        s->var, s->var);
		st(p, s->body, 2);
		fprintf(f, "\t}\n");
	} else if (l->kind == L_GEMM) {
		gemm_args(p, s->gemm, 1);
		fprintf(f, is_f32_gemm(s->gemm) ? "\tkiln_gemm_tiled(g);\n" : "\tkiln_qgemm_grid(g);\n");
	} else if (l->kind == L_TRANSPOSE) {
		const cg_transpose *t = s->tr;
		fprintf(f, "\tkiln_i64 C = ");
		ex(p, t->cols);
		fprintf(f, ", n = ");
		ex(p, t->rows);
		fprintf(f, " * C;\n\tfor (kiln_i64 e = (kiln_i64)blockIdx.x * blockDim.x + "
		        "threadIdx.x; e < n; e += (kiln_i64)gridDim.x * blockDim.x) {\n"
		        "\t\tkiln_i64 i = e / C, j = e %% C;\n\t\t");
		transpose_move(p, t);
		fprintf(f, ";\n\t}\n");
	} else {
		fprintf(f, "\tif (blockIdx.x || threadIdx.x)\n\t\treturn;\n");
		for (int i = l->first; i < l->first + l->n; i++)
			st(p, it[i], 1);
	}
	(void)nv;
}

/* host: the grid of launch l (blocks of 256 threads, or 16x16 for a GEMM) */
static void grid_fn(pr *p, int ki, int li, const launch *l, const cg_stmt *s)
{
	FILE *f = p->f;
	p->host = true;
	fprintf(f, "static void %s_grid_%d_%d(const kiln_i64 *sym, unsigned g[3])\n{\n\t(void)sym;\n",
	        p->pre, ki, li);
	if (l->kind == L_PARALLEL || l->kind == L_TRANSPOSE) {
		fprintf(f, "\tkiln_i64 n = ");
		if (l->kind == L_PARALLEL)
			ex(p, s->extent);
		else {
			ex(p, s->tr->rows);
			fprintf(f, " * ");
			ex(p, s->tr->cols);
		}
		fprintf(f, ";\n\tkiln_i64 blocks = (n + 255) / 256;\n"
		        "\tg[0] = blocks < 1 ? 1u : blocks > 65535 ? 65535u : (unsigned)blocks;\n"
		        "\tg[1] = g[2] = 1;\n");
	} else if (l->kind == L_GEMM) {
		const cg_gemm *gm = s->gemm;
		fprintf(f, "\tkiln_i64 M = ");
		ex(p, gm->M);
		fprintf(f, ", N = ");
		ex(p, gm->N);
		fprintf(f, ", B = ");
		ex(p, gm->batch);
		fprintf(f, ";\n\tkiln_i64 d[3] = {(N + 15) / 16, (M + 15) / 16, B};\n"
		        "\tfor (int i = 0; i < 3; i++)\n"
		        "\t\tg[i] = d[i] < 1 ? 1u : d[i] > 65535 ? 65535u : (unsigned)d[i];\n");
	} else
		fprintf(f, "\tg[0] = g[1] = g[2] = 1;\n");
	fprintf(f, "}\n");
	p->host = false;
}

static void kernel(pr *p, int ki, const cg_cuda_opts *o)
{
	const cg_module *m = p->m;
	const cg_kernel *k = &m->kern[ki];
	FILE *f = p->f;
	const cg_stmt *const *it, *one[1];
	int n;
	body_items(k->body, &it, &n, one);
	launch *L = calloc((size_t)n + 1, sizeof *L);
	int nv = k->nvar + 1;
	bool *used = calloc((size_t)m->nbuf + 1, 1), *wr = calloc((size_t)nv, 1);
	kiln_dtype *vdt = calloc((size_t)nv, sizeof *vdt);
	bool **lused = calloc((size_t)n + 1, sizeof *lused);
	if (!L || !used || !wr || !vdt || !lused) {
		p->oom = true;
		free(L), free(used), free(wr), free(vdt), free(lused);
		return;
	}
	int nl = split(m, k, L);
	fprintf(f, "\n/* %s%s%s%s: %d launch%s */\n", k->name, k->origin ? " (" : "",
	        k->origin ? k->origin : "", k->origin ? ")" : "", nl, nl == 1 ? "" : "es");
	for (int l = 0; l < nl && !p->oom; l++) {
		bool *u = lused[l] = calloc((size_t)m->nbuf + 1, 1);
		if (!u) {
			p->oom = true;
			break;
		}
		memset(wr, 0, (size_t)nv);
		bool *rd = calloc((size_t)nv + 1, 1);
		if (!rd) {
			p->oom = true;
			break;
		}
		for (int i = L[l].first; i < L[l].first + L[l].n; i++)
			stmt_uses(it[i], u, rd, wr, vdt);
		if (k->guard)
			expr_uses(k->guard, u, rd);
		bool chk = false;
		for (int i = L[l].first; i < L[l].first + L[l].n; i++)
			chk = chk || has_check(it[i]);
		fprintf(f, "#ifndef KILN_CUDA_HOST\nKILN_KERNEL void %s_%d_%d(kiln_sizes S, kiln_fault *F",
		        p->pre, ki, l);
		params(p, u);
		fprintf(f, ")\n{\n\t(void)S; (void)F;\n");
		/* a local the kernel sets but never reads (a recurrence's previous
		 * state that no gate reads) would be NVRTC's warning #550 */
		for (int v = 0; v < nv; v++)
			if (wr[v])
				fprintf(f, rd[v] ? "\t%s v%d = 0;\n" : "\t%s v%d __attribute__((unused)) = 0;\n",
				        ctype(vdt[v]), v);
		free(rd);
		launch_body(p, k, &L[l], it, nv);
		fprintf(f, "}\n#endif\n");
		(void)chk;
	}
	fprintf(f, "#if defined(KILN_CUDA_EMULATE) || defined(KILN_CUDA_HOST)\n");
	for (int l = 0; l < nl; l++)
		grid_fn(p, ki, l, &L[l], it[L[l].first]);
	fprintf(f, "#endif\n");
	if (o->emulate && !p->oom) {
		fprintf(f, "#ifdef KILN_CUDA_EMULATE\nstatic void %s_run_%d(rt_exec *x)\n{\n"
		        "\tkiln_sizes S = {};\n\tfor (int i = 0; i < %d; i++)\n"
		        "\t\tS.s[i] = x->sym[i];\n"
		        "\tkiln_fault F = {x, %s_what};\n\tunsigned g[3];\n", p->pre, ki, m->nsym,
		        p->pre);
		for (int l = 0; l < nl; l++) {
			fprintf(f, "\t%s_grid_%d_%d(S.s, g);\n\tkiln_launch(g, %s, [&] { %s_%d_%d(S, &F",
			        p->pre, ki, l,
			        L[l].kind == L_GEMM ? "16" : L[l].kind == L_SERIAL ? "1" : "256", p->pre,
			        ki, l);
			args(p, lused[l], true);
			fprintf(f, "); });\n");
		}
		fprintf(f, "}\n#endif\n");
	}
	if (!p->oom) { /* the host side: each launch with its device buffers */
		fprintf(f, "#ifdef KILN_CUDA_HOST\nstatic int %s_launch_%d(kiln_host *h, const kiln_i64 *sym, "
		        "kiln_u64 *buf)\n{\n\tkiln_sizes S = {{0}};\n\tunsigned g[3];\n"
		        "\tvoid *F = kiln_host_fault(h);\n\tint rc = 0;\n\t(void)buf;\n"
		        "\tfor (int i = 0; i < %d; i++)\n\t\tS.s[i] = sym[i];\n", p->pre, ki, m->nsym);
		for (int l = 0; l < nl; l++) {
			fprintf(f, "\t%s_grid_%d_%d(S.s, g);\n\t{\n\t\tvoid *a[] = {&S, F", p->pre, ki, l);
			for (int b = 0; b < m->nbuf; b++)
				if (lused[l][b])
					fprintf(f, ", &buf[%d]", b);
			fprintf(f, "};\n\t\tif ((rc = kiln_host_launch(h, %d, g, %s, a)))\n\t\t\treturn rc;\n"
			        "\t}\n", p->nlaunch + l,
			        L[l].kind == L_GEMM ? "16" : L[l].kind == L_SERIAL ? "1" : "256");
		}
		fprintf(f, "\treturn rc;\n}\n#endif\n");
		for (int l = 0; l < nl && !p->oom; l++) {
			char *name = NULL;
			if (asprintf(&name, "%s_%d_%d", p->pre, ki, l) < 0) {
				p->oom = true;
				break;
			}
			add_launch(p, name);
		}
	}
	for (int l = 0; l < nl; l++)
		free(lused[l]);
	free(L), free(used), free(wr), free(vdt), free(lused);
}

/* ---- what it takes ------------------------------------------------------------ */

static bool dt_ok(kiln_dtype dt)
{
	return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_I8 || dt == KILN_U8 ||
	       dt == KILN_I32 || dt == KILN_I64 || dt == KILN_BOOL || dt == KILN_F16 ||
	       dt == KILN_BF16;
}

static bool find_gemm(const cg_module *m, const cg_stmt *s, char *why, size_t size)
{
	if (!s)
		return true;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			if (!find_gemm(m, s->items[i], why, size))
				return false;
		return true;
	case CG_FOR: return find_gemm(m, s->body, why, size);
	case CG_IF: return find_gemm(m, s->then_s, why, size) && find_gemm(m, s->else_s, why, size);
	case CG_GEMM: {
		const cg_gemm *g = s->gemm;
		if (g->act >= CG_ACT_COUNT) {
			snprintf(why, size, "GEMM activation %d", (int)g->act);
			return false;
		}
		if (g->c_block || g->b_block) {
			snprintf(why, size, "GEMM with %s in blocks of %d rows", g->c_block ? "C" : "B",
			         g->c_block ? g->c_block : g->b_block);
			return false;
		}
		return true;
	}
	default: return true;
	}
}

bool cg_cuda_supports(const cg_module *m, const cg_kernel *k, char *why, size_t size)
{
	if (m->nsym > CG_CUDA_MAX_SYM) {
		snprintf(why, size, "%d size symbols (it takes %d)", m->nsym, CG_CUDA_MAX_SYM);
		return false;
	}
	for (int b = 0; b < m->nbuf; b++)
		if (!dt_ok(m->buf[b].dt)) {
			snprintf(why, size, "buffer of dtype %s", kiln_dtype_name(m->buf[b].dt));
			return false;
		}
	return find_gemm(m, k->body, why, size);
}

/* ---- the module --------------------------------------------------------------- */

char *cg_cuda_print(const cg_module *m, const cg_cuda_opts *o)
{
	cg_cuda_opts none = {0};
	o = o ? o : &none;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	pr p = {.m = m, .f = f, .pre = o->prefix ? o->prefix : "kiln"};
	fprintf(f, "#define KILN_MAX_SYM %d\n", CG_CUDA_MAX_SYM);
	fputs(prelude, f);
	if (o->emulate)
		fprintf(f, "#ifdef KILN_CUDA_EMULATE\nextern const char *const %s_what[];\n#endif\n",
		        p.pre);
	for (int k = 0; k < m->nkern && !p.oom; k++)
		kernel(&p, k, o);
	if (o->emulate) {
		fprintf(f, "\n#ifdef KILN_CUDA_EMULATE\nconst char *const %s_what[] = {", p.pre);
		for (int i = 0; i < p.nchecks; i++) {
			fprintf(f, "%s\n\t\"", i ? "," : "");
			for (const char *c = p.what[i]; *c; c++)
				fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : (unsigned char)*c < 32 ? "?"
				        : "%c", *c);
			fprintf(f, "\"");
		}
		fprintf(f, "%s\"\"};\nstatic const rt_kernel_fn %s_kernels[] = {",
		        p.nchecks ? ",\n\t" : "", p.pre);
		for (int k = 0; k < m->nkern; k++)
			fprintf(f, "%s%s_run_%d", k ? ", " : "", p.pre, k);
		fprintf(f, "%s};\n#endif\n", m->nkern ? "" : "NULL");
	}
	fprintf(f, "\n#ifdef KILN_CUDA_HOST\n#define KILN_NLAUNCH %d\n"
	        "static const char *const %s_launch_names[] = {", p.nlaunch, p.pre);
	for (int i = 0; i < p.nlaunch; i++)
		fprintf(f, "%s\"%s\"", i ? ", " : "", p.launch[i]);
	fprintf(f, "%s};\nstatic const char *const %s_what[] = {", p.nlaunch ? "" : "\"\"", p.pre);
	for (int i = 0; i < p.nchecks; i++) {
		fprintf(f, "%s\n\t\"", i ? "," : "");
		for (const char *c = p.what[i]; *c; c++)
			fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : (unsigned char)*c < 32 ? "?" : "%c", *c);
		fprintf(f, "\"");
	}
	fprintf(f, "%s\"\"};\nstatic int (*const %s_launches[])(kiln_host *, const kiln_i64 *, "
	        "kiln_u64 *) = {", p.nchecks ? ",\n\t" : "", p.pre);
	for (int k = 0; k < m->nkern; k++)
		fprintf(f, "%s%s_launch_%d", k ? ", " : "", p.pre, k);
	fprintf(f, "%s};\n#endif\n", m->nkern ? "" : "NULL");
	for (int i = 0; i < p.nlaunch; i++)
		free(p.launch[i]);
	free(p.launch);
	free(p.what);
	bool bad = ferror(f) != 0;
	if (fclose(f) != 0 || bad || p.oom) {
		free(text);
		return NULL;
	}
	return text;
}

void cg_cuda_print_expr(FILE *f, const cg_module *m, const cg_expr *e)
{
	pr p = {.m = m, .f = f, .host = true, .pre = "kiln"};
	ex(&p, e);
	free(p.what);
}
