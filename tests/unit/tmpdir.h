/* tmpdir.h: one scratch folder per test, for Check tests that write files.
 * tmp_make("kiln_train") creates /tmp/kiln_train_XXXXXX, tmp_path names a
 * file in it (two results may be alive at once), tmp_remove deletes it. */
#ifndef KILN_TEST_TMPDIR_H
#define KILN_TEST_TMPDIR_H
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

static char tmpl[64];

static void tmp_make(const char *prefix)
{
	snprintf(tmpl, sizeof tmpl, "/tmp/%s_XXXXXX", prefix);
	ck_assert_ptr_nonnull(mkdtemp(tmpl));
}

static void tmp_remove(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
	ck_assert_int_eq(system(cmd), 0);
}

static const char *tpath(const char *name)
{
	static char bufs[2][128];
	static int k;
	char *b = bufs[k++ % 2];
	snprintf(b, 128, "%s/%s", tmpl, name);
	return b;
}
#endif
