/*
 * cuda_nvrtc.c: CUDA C to cubin or PTX with NVRTC, linked where CMake's
 * FindCUDAToolkit found the toolkit (KILN_HAVE_CUDA); elsewhere every call
 * says that this build has no CUDA toolkit.  NVRTC needs no GPU and no
 * driver: a cubin for sm_80 or sm_90 is made on any machine.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda.h"

#ifdef KILN_HAVE_CUDA
#include <nvrtc.h>

bool cg_nvrtc_available(void)
{
	return true;
}

/* NVRTC's log, on one line, into a message: at most size bytes. */
static void log_of(nvrtcProgram prog, char *out, size_t size)
{
	size_t n = 0;
	out[0] = 0;
	if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n <= 1)
		return;
	char *log = malloc(n);
	if (!log || nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
		free(log);
		return;
	}
	size_t k = 0;
	for (size_t i = 0; log[i] && k + 1 < size; i++)
		out[k++] = log[i] == '\n' ? ';' : log[i];
	while (k && (out[k - 1] == ';' || out[k - 1] == ' '))
		k--;
	out[k] = 0;
	free(log);
}

kiln_status cg_nvrtc_compile(const char *src, const char *name, const char *arch, bool ptx,
                             bool strict, bool fast_math, void **out, size_t *n,
                             kiln_error *err)
{
	*out = NULL, *n = 0;
	if (strncmp(arch, "sm_", 3) != 0 || !arch[3] || strlen(arch) > 8)
		return ir_seterr(err, KILN_EINVAL, "--cuda-arch: '%s' is not an architecture like "
		                 "sm_80", arch);
	char archopt[32];
	snprintf(archopt, sizeof archopt, "-arch=%s_%s", ptx ? "compute" : "sm", arch + 3);
	const char *opts[] = {archopt, "-std=c++14", "-default-device", "--fmad=false",
	                      fast_math ? "-use_fast_math" : "-prec-div=true"};
	nvrtcProgram prog;
	nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
	if (r != NVRTC_SUCCESS)
		return ir_seterr(err, KILN_ENOMEM, "NVRTC: %s", nvrtcGetErrorString(r));
	r = nvrtcCompileProgram(prog, (int)(sizeof opts / sizeof *opts), opts);
	char log[1536];
	log_of(prog, log, sizeof log);
	kiln_status st = KILN_OK;
	if (r != NVRTC_SUCCESS)
		st = ir_seterr(err, KILN_EINVAL, "NVRTC could not compile %s for %s: %s: %s", name,
		               arch, nvrtcGetErrorString(r), log[0] ? log : "(no log)");
	else if (strict && log[0])
		st = ir_seterr(err, KILN_EINVAL, "NVRTC warned compiling %s for %s: %s", name, arch,
		               log);
	size_t size = 0;
	if (st == KILN_OK)
		r = ptx ? nvrtcGetPTXSize(prog, &size) : nvrtcGetCUBINSize(prog, &size);
	if (st == KILN_OK && r == NVRTC_SUCCESS && (*out = malloc(size ? size : 1))) {
		r = ptx ? nvrtcGetPTX(prog, *out) : nvrtcGetCUBIN(prog, *out);
		*n = size;
	}
	if (st == KILN_OK && (r != NVRTC_SUCCESS || !*out)) {
		free(*out);
		*out = NULL, *n = 0;
		st = ir_seterr(err, r != NVRTC_SUCCESS ? KILN_EINVAL : KILN_ENOMEM, "NVRTC: %s: %s",
		               name, r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "out of memory");
	}
	nvrtcDestroyProgram(&prog);
	return st;
}

#else

bool cg_nvrtc_available(void)
{
	return false;
}

kiln_status cg_nvrtc_compile(const char *src, const char *name, const char *arch, bool ptx,
                             bool strict, bool fast_math, void **out, size_t *n,
                             kiln_error *err)
{
	*out = NULL, *n = 0;
	return ir_seterr(err, KILN_EUNSUPPORTED, "this kiln was built without the CUDA toolkit "
	                 "(CMake's FindCUDAToolkit found no NVRTC): it cannot compile CUDA C");
}

#endif
