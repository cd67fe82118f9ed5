/*
 * rtpath.c: where the runtime archive is that every generated library
 * links (libkilnrt_gen.a: the model driver and thread pool; backend.h's
 * cg_runtime_archive).
 *
 * The compiler may run from its build tree, from an installed tree that
 * has since moved, or inside a user's program that links libkiln.so or
 * libkiln.a, so no single compiled-in path is right.  In order, the first
 * that is a readable regular file wins:
 *
 *   1. $KILN_RT_LIB, when set and not empty (then nothing else is tried:
 *      a wrong override is an error, not a reason to use another archive);
 *   2. beside the running executable, as installed: <dir of
 *      /proc/self/exe>/KILN_RT_FROM_BIN (bin/../lib/kiln);
 *   3. beside the object this code is in, when that is not the executable
 *      (libkiln.so, found with dladdr): <its dir>/KILN_RT_FROM_LIB;
 *   4. the build tree's archive (KILN_RT_GEN_LIB), when the executable or
 *      libkiln.so is in that build tree, so a build tree never takes an
 *      older installed copy;
 *   5. the configured install prefix's (KILN_RT_INSTALLED: a program
 *      linked with libkiln.a from anywhere);
 *   6. the build tree's archive, as a last resort.
 *
 * The CMake build (CMakeLists.txt) defines the KILN_RT_* names for this
 * file alone.  When none exists the error lists every path tried.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/backend.h"

#if !defined(KILN_RT_FROM_BIN) || !defined(KILN_RT_FROM_LIB) || !defined(KILN_RT_INSTALLED) || \
	!defined(KILN_RT_NAME) || !defined(KILN_RT_GEN_LIB)
#error "the build defines KILN_RT_FROM_BIN, _FROM_LIB, _INSTALLED, _NAME and KILN_RT_GEN_LIB"
#endif

static bool is_file(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, R_OK) == 0;
}

/* The folder of path into dir ("" when path has no '/'). */
static void dir_of(const char *path, char *dir, size_t size)
{
	const char *slash = strrchr(path, '/');
	size_t n = slash ? (size_t)(slash - path) : 0;
	snprintf(dir, size, "%.*s", (int)(n < size ? n : size - 1), path);
}

static bool starts_with_dir(const char *path, const char *dir)
{
	size_t n = strlen(dir);
	return n && strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == 0);
}

kiln_status cg_runtime_find(const cg_rt_search *w, char *out, size_t size, kiln_error *err)
{
	const char *env = w->env, *exe = w->exe, *lib = w->lib;
	if (env && *env) {
		if (is_file(env)) {
			if (snprintf(out, size, "%s", env) >= (int)size)
				return ir_seterr(err, KILN_EINVAL, "$KILN_RT_LIB: path too long");
			return KILN_OK;
		}
		return ir_seterr(err, KILN_EIO, "$KILN_RT_LIB is '%s', which is not a readable file: "
		                 "it must name the runtime archive (%s) that every compiled "
		                 "library links; unset it to use the installed one", env,
		                 KILN_RT_NAME);
	}
	char cand[6][PATH_MAX + 64];
	int n = 0;
	char exe_dir[PATH_MAX] = "", lib_dir[PATH_MAX] = "", build_dir[PATH_MAX];
	dir_of(w->build, build_dir, sizeof build_dir);
	if (exe && *exe) {
		dir_of(exe, exe_dir, sizeof exe_dir);
		snprintf(cand[n++], sizeof cand[0], "%s/%s/%s", exe_dir, KILN_RT_FROM_BIN, KILN_RT_NAME);
	}
	if (lib && *lib && (!exe || strcmp(lib, exe) != 0)) {
		dir_of(lib, lib_dir, sizeof lib_dir);
		snprintf(cand[n++], sizeof cand[0], "%s/%s/%s", lib_dir, KILN_RT_FROM_LIB, KILN_RT_NAME);
	}
	bool in_build = starts_with_dir(exe_dir, build_dir) || starts_with_dir(lib_dir, build_dir);
	if (in_build)
		snprintf(cand[n++], sizeof cand[0], "%s", w->build);
	snprintf(cand[n++], sizeof cand[0], "%s/%s", w->installed, KILN_RT_NAME);
	if (!in_build)
		snprintf(cand[n++], sizeof cand[0], "%s", w->build);
	for (int i = 0; i < n; i++)
		if (is_file(cand[i])) {
			char real[PATH_MAX];
			if (snprintf(out, size, "%s", realpath(cand[i], real) ? real : cand[i]) >=
			    (int)size)
				return ir_seterr(err, KILN_EINVAL, "%s: path too long", cand[i]);
			return KILN_OK;
		}
	char tried[900] = "";
	size_t used = 0;
	for (int i = 0; i < n && used < sizeof tried; i++)
		used += (size_t)snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "",
		                         cand[i]);
	return ir_seterr(err, KILN_EIO, "cannot find the runtime archive %s that every compiled "
	                 "library links; tried $KILN_RT_LIB (not set), %s; set KILN_RT_LIB to "
	                 "its path", KILN_RT_NAME, tried);
}

kiln_status cg_runtime_archive(char *out, size_t size, kiln_error *err)
{
	char exe[PATH_MAX] = "", lib[PATH_MAX] = "";
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	exe[n > 0 ? n : 0] = 0;
	Dl_info info;
	if (dladdr((void *)cg_runtime_archive, &info) && info.dli_fname &&
	    !realpath(info.dli_fname, lib))
		lib[0] = 0;
	cg_rt_search w = {.env = getenv("KILN_RT_LIB"), .exe = exe, .lib = lib,
	                  .build = KILN_RT_GEN_LIB, .installed = KILN_RT_INSTALLED};
	return cg_runtime_find(&w, out, size, err);
}
