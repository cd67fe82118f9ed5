/*
 * target.c: the LLVM target machine kiln compiles for.
 *
 * By default that is the host: LLVM 14 names a Zen 5 "generic", so the
 * CPU name alone would give SSE2 code; passing the host's feature string
 * (LLVMGetHostCPUFeatures) as well keeps AVX-512.  A --cpu choice (say
 * "x86-64-v3" for a portable AVX2 build) uses that CPU's own features
 * unless --features adds to them.  LLVM only warns on stderr about an
 * unknown CPU or feature and carries on, so both are checked here against
 * the names LLVM 14 knows for x86 (from `llc-14 -march=x86-64 -mcpu=help`)
 * and rejected with a message instead.  vec_bits, the widest float vector,
 * sizes the GEMM micro-kernel.
 *
 * LLVM 14 tunes every AVX-512 Intel CPU it knows (skylake-avx512 through
 * sapphirerapids, and icelake-client, its name for newer Xeons it does not
 * know) with prefer-256-bit, so its vectorizer picks ymm for the loops the
 * GEMM does not cover.  kiln's kernels are long, regular loops that want
 * the widest vectors, so where the target has AVX-512 every function gets
 * "prefer-vector-width"="512" (prefer_bits), unless the feature string
 * itself asks for +prefer-256-bit or +prefer-128-bit.
 *
 * $KILN_CPU and $KILN_FEATURES stand in for the host when no CPU is given,
 * so a test or a build machine can target a CPU it is not running on.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/llvm.h"

static const char x86_cpus[] =
	" alderlake amdfam10 athlon athlon-4 athlon-fx athlon-mp athlon-tbird athlon-xp"
	" athlon64 athlon64-sse3 atom barcelona bdver1 bdver2 bdver3 bdver4 bonnell"
	" broadwell btver1 btver2 c3 c3-2 cannonlake cascadelake cooperlake core-avx-i"
	" core-avx2 core2 corei7 corei7-avx generic geode goldmont goldmont-plus haswell"
	" i386 i486 i586 i686 icelake-client icelake-server ivybridge k6 k6-2 k6-3 k8"
	" k8-sse3 knl knm lakemont nehalem nocona opteron opteron-sse3 penryn pentium"
	" pentium-m pentium-mmx pentium2 pentium3 pentium3m pentium4 pentium4m pentiumpro"
	" prescott rocketlake sandybridge sapphirerapids silvermont skx skylake"
	" skylake-avx512 slm tigerlake tremont westmere winchip-c6 winchip2 x86-64"
	" x86-64-v2 x86-64-v3 x86-64-v4 yonah znver1 znver2 znver3 ";

static const char x86_features[] =
	" 16bit-mode 32bit-mode 3dnow 3dnowa 64bit 64bit-mode adx aes amx-bf16 amx-int8"
	" amx-tile avx avx2 avx512bf16 avx512bitalg avx512bw avx512cd avx512dq avx512er"
	" avx512f avx512fp16 avx512ifma avx512pf avx512vbmi avx512vbmi2 avx512vl"
	" avx512vnni avx512vp2intersect avx512vpopcntdq avxvnni bmi bmi2 branchfusion"
	" cldemote clflushopt clwb clzero cmov crc32 cx16 cx8 enqcmd ermsb f16c"
	" false-deps-lzcnt-tzcnt false-deps-popcnt fast-11bytenop fast-15bytenop"
	" fast-7bytenop fast-bextr fast-gather fast-hops fast-lzcnt fast-movbe"
	" fast-scalar-fsqrt fast-scalar-shift-masks fast-shld-rotate"
	" fast-variable-crosslane-shuffle fast-variable-perlane-shuffle fast-vector-fsqrt"
	" fast-vector-shift-masks fma fma4 fsgsbase fsrm fxsr gfni hreset idivl-to-divb"
	" idivq-to-divl invpcid kl lea-sp lea-uses-ag lvi-cfi lvi-load-hardening lwp lzcnt"
	" macrofusion mmx movbe movdir64b movdiri mwaitx nopl pad-short-functions pclmul"
	" pconfig pku popcnt prefer-128-bit prefer-256-bit prefer-mask-registers"
	" prefetchwt1 prfchw ptwrite rdpid rdrnd rdseed retpoline retpoline-external-thunk"
	" retpoline-indirect-branches retpoline-indirect-calls rtm sahf serialize seses sgx"
	" sha shstk slow-3ops-lea slow-incdec slow-lea slow-pmaddwd slow-pmulld slow-shld"
	" slow-two-mem-ops slow-unaligned-mem-16 slow-unaligned-mem-32 soft-float sse"
	" sse-unaligned-mem sse2 sse3 sse4.1 sse4.2 sse4a ssse3 tagged-globals tbm"
	" tsxldtrk uintr use-aa use-glm-div-sqrt-costs use-slm-arith-costs vaes"
	" vpclmulqdq vzeroupper waitpkg wbnoinvd widekl x87 xop xsave xsavec xsaveopt"
	" xsaves ";

/* CPUs whose own feature set has AVX-512 or AVX2 (for vec_bits when no
 * feature string says so). */
static const char cpus_512[] = " cannonlake cascadelake cooperlake icelake-client"
	" icelake-server knl knm rocketlake sapphirerapids skx skylake-avx512 tigerlake"
	" x86-64-v4 ";
static const char cpus_256[] = " alderlake bdver2 bdver3 bdver4 broadwell core-avx2"
	" haswell x86-64-v3 znver1 znver2 znver3 ";
/* ... and those with AVX512-VNNI, or AVX-VNNI only (the 8-bit dot product). */
static const char cpus_vnni512[] = " cascadelake cooperlake icelake-client icelake-server"
	" rocketlake sapphirerapids tigerlake ";
static const char cpus_avxvnni[] = " alderlake ";

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_llvm(void)
{
	LLVMInitializeX86TargetInfo();
	LLVMInitializeX86Target();
	LLVMInitializeX86TargetMC();
	LLVMInitializeX86AsmPrinter();
}

/* Is the n bytes at s a word of the space-delimited list? */
static bool in_list(const char *list, const char *s, size_t n)
{
	if (n == 0 || n > 64)
		return false;
	char key[68];
	key[0] = ' ';
	memcpy(key + 1, s, n);
	key[n + 1] = ' ';
	key[n + 2] = 0;
	return strstr(list, key) != NULL;
}

/* Every comma-separated item must be +name or -name with a known name. */
static kiln_status check_features(const char *f, kiln_error *err)
{
	for (const char *p = f; *p;) {
		size_t n = strcspn(p, ",");
		if (n > 0 && ((p[0] != '+' && p[0] != '-') || !in_list(x86_features, p + 1, n - 1)))
			return ir_seterr(err, KILN_EINVAL,
			                 "unknown CPU feature '%.*s' (want +name or -name, "
			                 "see llc-14 -march=x86-64 -mattr=help)", (int)n, p);
		p += n + (p[n] == ',');
	}
	return KILN_OK;
}

/* The last "+avx512f" / "-avx512f" in a feature string decides; 0: none. */
static int feature_sign(const char *f, const char *name)
{
	int sign = 0;
	size_t n = strlen(name);
	for (const char *p = f; *p;) {
		size_t len = strcspn(p, ",");
		if (len == n + 1 && strncmp(p + 1, name, n) == 0)
			sign = p[0] == '+' ? 1 : -1;
		p += len + (p[len] == ',');
	}
	return sign;
}

static int vector_bits(const char *cpu, const char *features)
{
	int a512 = feature_sign(features, "avx512f"), a256 = feature_sign(features, "avx2");
	size_t n = strlen(cpu);
	if (a512 == 0)
		a512 = in_list(cpus_512, cpu, n) ? 1 : -1;
	if (a256 == 0)
		a256 = in_list(cpus_256, cpu, n) || in_list(cpus_512, cpu, n) ? 1 : -1;
	return a512 > 0 ? 512 : a256 > 0 ? 256 : 128;
}

/* The widest vectors vpdpbusd runs on: AVX512-VNNI at the target's
 * width (its 256- and 128-bit forms need AVX512-VL), AVX-VNNI at 256 and
 * 128 bits; 0: none (kiln_qgemm then spells the dot product out). */
static int vnni_bits(const char *cpu, const char *features, int vec_bits)
{
	size_t n = strlen(cpu);
	int v512 = feature_sign(features, "avx512vnni"), vl = feature_sign(features, "avx512vl");
	int avx = feature_sign(features, "avxvnni");
	if (v512 == 0)
		v512 = in_list(cpus_vnni512, cpu, n) ? 1 : -1;
	if (vl == 0)
		vl = in_list(cpus_512, cpu, n) ? 1 : -1;
	if (avx == 0)
		avx = in_list(cpus_avxvnni, cpu, n) || strcmp(cpu, "sapphirerapids") == 0 ? 1 : -1;
	if (v512 > 0 && vec_bits >= 512)
		return 512;
	if ((v512 > 0 && vl > 0) || avx > 0)
		return vec_bits < 256 ? vec_bits : 256;
	return 0;
}

/* AMX-INT8 with its tiles: only from the feature string (the host's,
 * or --features), so a CPU name alone (sapphirerapids) never selects it
 * and "-amx-int8" turns it off. */
static bool amx(const char *features)
{
	return feature_sign(features, "amx-int8") > 0 && feature_sign(features, "amx-tile") > 0;
}

/* 512 where the target has AVX-512 and its features do not ask for
 * narrower vectors; 0: leave it to the CPU's tuning. */
static int preferred_bits(int vec_bits, const char *features)
{
	if (vec_bits < 512 || feature_sign(features, "prefer-256-bit") > 0 ||
	    feature_sign(features, "prefer-128-bit") > 0)
		return 0;
	return 512;
}

static const char *env(const char *name)
{
	const char *s = getenv(name);
	return s && *s ? s : NULL;
}

kiln_status cg_target_init(cg_target *t, const char *cpu, const char *features,
                           kiln_error *err)
{
	memset(t, 0, sizeof *t);
	pthread_once(&init_once, init_llvm);
	t->triple = LLVMGetDefaultTargetTriple();
	bool from_env = !cpu && env("KILN_CPU");
	if (from_env) {
		cpu = env("KILN_CPU");
		features = features ? features : env("KILN_FEATURES");
	} else if (!cpu && !features) {
		features = env("KILN_FEATURES"); /* on the host's CPU */
	}
	if (cpu) {
		t->cpu = LLVMCreateMessage(cpu);
		t->features = LLVMCreateMessage(features ? features : "");
	} else {
		t->cpu = LLVMGetHostCPUName();
		t->features = features ? LLVMCreateMessage(features) : LLVMGetHostCPUFeatures();
		t->l2_bytes = cg_host_l2_bytes();
	}
	kiln_status st = KILN_OK;
	if (strncmp(t->triple, "x86_64", 6) == 0) {
		if (!in_list(x86_cpus, t->cpu, strlen(t->cpu)))
			st = ir_seterr(err, KILN_EINVAL, "unknown CPU '%s'%s (LLVM 14 knows e.g. "
			               "x86-64-v3, x86-64-v4, skylake-avx512, znver3)", t->cpu,
			               from_env ? " (from $KILN_CPU)" : "");
		else if (features)
			st = check_features(features, err);
	}
	LLVMTargetRef target = NULL;
	char *msg = NULL;
	if (st == KILN_OK && LLVMGetTargetFromTriple(t->triple, &target, &msg)) {
		st = ir_seterr(err, KILN_EUNSUPPORTED, "no LLVM target for '%s': %s", t->triple,
		               msg ? msg : "?");
	}
	LLVMDisposeMessage(msg);
	if (st == KILN_OK) {
		t->vec_bits = vector_bits(t->cpu, t->features);
		t->prefer_bits = preferred_bits(t->vec_bits, t->features);
		t->vnni_bits = vnni_bits(t->cpu, t->features, t->vec_bits);
		t->amx = t->vec_bits >= 512 && t->vnni_bits >= 512 && amx(t->features);
		t->tm = LLVMCreateTargetMachine(target, t->triple, t->cpu, t->features,
		                                LLVMCodeGenLevelAggressive, LLVMRelocPIC,
		                                LLVMCodeModelDefault);
		if (!t->tm)
			st = ir_seterr(err, KILN_EUNSUPPORTED, "LLVM could not make a target "
			               "machine for %s (cpu %s)", t->triple, t->cpu);
	}
	if (st != KILN_OK)
		cg_target_free(t);
	return st;
}

void cg_target_free(cg_target *t)
{
	if (t->tm)
		LLVMDisposeTargetMachine(t->tm);
	LLVMDisposeMessage(t->triple);
	LLVMDisposeMessage(t->cpu);
	LLVMDisposeMessage(t->features);
	memset(t, 0, sizeof *t);
}
