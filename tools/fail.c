/*
 * fail.c: the CLI's error helper, shared by every tools/ file, so each
 * failure prints the same one line: "kiln: error: ..." on stderr.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

int tool_fail_err(const char *path, const kiln_error *e, kiln_status st)
{
	const char *msg = e->msg[0] ? e->msg : kiln_status_str(st);
	return !path || strstr(msg, path) ? tool_fail(1, "%s", msg)
	                                  : tool_fail(1, "%s: %s", path, msg);
}
