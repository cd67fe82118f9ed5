/*
 * so_util.h: helpers the generated-library tests share (test_runtime_model.c,
 * test_generated.c): building a .so or a driver program against the
 * never-sanitized runtime archive the way `kiln compile` links, listing a
 * library's NEEDED entries with readelf, and running valgrind.
 *
 * Everything runs through the shell with paths quoted; output is captured
 * into a caller buffer so a failing assertion can show it.
 */
#ifndef KILN_SO_UTIL_H
#define KILN_SO_UTIL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#ifndef KILN_RT_GEN_LIB
#error "KILN_RT_GEN_LIB must name the runtime archive generated libraries link"
#endif

/* Runs cmd (stderr too) into out; returns its exit status, -1 if it could
 * not run. */
static inline int sh(const char *cmd, char *out, size_t size)
{
	char full[8192];
	if (snprintf(full, sizeof full, "(%s) 2>&1", cmd) >= (int)sizeof full)
		return -1; /* too long to run as given */
	FILE *p = popen(full, "r");
	if (!p)
		return -1;
	size_t n = fread(out, 1, size - 1, p);
	out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline bool have_tool(const char *name)
{
	char cmd[256], out[256];
	snprintf(cmd, sizeof cmd, "command -v %s", name);
	return sh(cmd, out, sizeof out) == 0;
}

/* A fresh directory under the build tree for this test's files. */
static inline const char *so_dir(const char *name)
{
	static char dir[1024];
	snprintf(dir, sizeof dir, "%s/%s", KILN_BIN, name);
	mkdir(dir, 0777);
	return dir;
}

/* cc -shared src -> so, linked as kiln compile links a model. */
static inline int build_so(const char *src, const char *so, char *out, size_t size)
{
	char cmd[4096];
	snprintf(cmd, sizeof cmd,
	         "cc -shared -fPIC -O1 -fvisibility=hidden -I'%s/include' -I'%s' -o '%s' '%s' '%s' "
	         "-lm -lpthread",
	         KILN_SRC, KILN_SRC, so, src, KILN_RT_GEN_LIB);
	return sh(cmd, out, size);
}

/* tests/fixtures/rt/drive.c against the same archive, unsanitized, so
 * valgrind can watch it even from an ASan build. */
static inline int build_driver(const char *exe, char *out, size_t size)
{
	char cmd[4096];
	snprintf(cmd, sizeof cmd,
	         "cc -O1 -g -I'%s/include' -I'%s' -o '%s' '%s/tests/fixtures/rt/drive.c' '%s' "
	         "-ldl -lm -lpthread",
	         KILN_SRC, KILN_SRC, exe, KILN_SRC, KILN_RT_GEN_LIB);
	return sh(cmd, out, size);
}

/* The NEEDED entries of so that are not libc, libm, libpthread or the
 * loader, space-separated ("" when clean); false if readelf failed. */
static inline bool extra_needed(const char *so, char *extra, size_t size)
{
	char cmd[2048], out[8192];
	snprintf(cmd, sizeof cmd, "readelf -d '%s'", so);
	if (sh(cmd, out, sizeof out) != 0)
		return false;
	static const char *ok[] = {"[libc.so.", "[libm.so.", "[libpthread.so.", "[ld-linux"};
	extra[0] = 0;
	for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
		char *lib = strstr(l, "(NEEDED)") ? strchr(l, '[') : NULL;
		bool fine = !lib;
		for (int i = 0; lib && i < 4; i++)
			fine = fine || strncmp(lib, ok[i], strlen(ok[i])) == 0;
		if (!fine && strlen(extra) + strlen(lib) + 2 < size)
			strcat(strcat(extra, lib), " ");
	}
	return true;
}

/* valgrind on `exe args`: exit status 0 when no error and no leak. */
static inline int valgrind(const char *exe, const char *args, char *out, size_t size)
{
	char cmd[4096];
	snprintf(cmd, sizeof cmd,
	         "valgrind -q --error-exitcode=99 --leak-check=full "
	         "--errors-for-leak-kinds=definite,indirect,possible '%s' %s",
	         exe, args);
	return sh(cmd, out, size);
}

#endif /* KILN_SO_UTIL_H */
