/*
 * fail.c: the CLI's error helper, shared by every tools/ file, so each
 * failure prints the same one line: "kiln: error: ..." on stderr; the
 * option readers every command's parser uses; and the default thread count.
 */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "tools/tools.h"

int tool_fail(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("kiln: error: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return code;
}

const char *tool_optval(int argc, char **argv, int *i, const char *lng, const char *shrt)
{
	size_t n = strlen(lng);
	if (strncmp(argv[*i], lng, n) == 0 && argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if ((strcmp(argv[*i], lng) == 0 || (shrt && strcmp(argv[*i], shrt) == 0)) && *i + 1 < argc)
		return argv[++*i];
	return NULL;
}

bool tool_is_opt(const char *a, const char *lng, const char *shrt)
{
	size_t n = strlen(lng);
	return strcmp(a, lng) == 0 || (strncmp(a, lng, n) == 0 && a[n] == '=') ||
	       (shrt && strcmp(a, shrt) == 0);
}

bool tool_num(const char *s, double *v)
{
	char *end;
	errno = 0;
	*v = s ? strtod(s, &end) : 0;
	return s && *s && !*end && !errno;
}

int tool_fail_err(const char *path, const kiln_error *e, kiln_status st)
{
	const char *msg = e->msg[0] ? e->msg : kiln_status_str(st);
	return !path || strstr(msg, path) ? tool_fail(1, "%s", msg)
	                                  : tool_fail(1, "%s: %s", path, msg);
}

int tool_cpus(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
		return CPU_COUNT(&set) < 256 ? CPU_COUNT(&set) : 256;
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n < 256 ? (int)n : 256;
}
