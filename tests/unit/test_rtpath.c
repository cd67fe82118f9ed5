/*
 * test_rtpath.c: where kiln_compile finds the runtime archive it links into
 * every library (codegen/rtpath.c, cg_runtime_find): $KILN_RT_LIB alone
 * when set, else beside an installed executable or libkiln.so, the build
 * tree before the install prefix only when running from the build tree,
 * and a message listing every path tried when there is none.  Fake trees
 * under a scratch folder stand in for installs; the build tree's own
 * archive (KILN_RT_GEN_LIB) for the real one.  The CMake build gives this
 * file the same KILN_RT_* definitions as rtpath.c.
 *
 * Also how the link reports failure (codegen/emit.c, cg_run_tool): one
 * message naming the library, the tool's exit status, what it printed and
 * the command; an empty argument (which left only ld's "cannot find :")
 * is refused before anything runs.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check_main.h"
#include "codegen/backend.h"
#include "tmpdir.h"

#ifndef KILN_RT_FROM_BIN
#error "the build defines KILN_RT_FROM_BIN, KILN_RT_FROM_LIB, KILN_RT_NAME"
#endif

/* mkdir -p for the folder of path, then an empty file at path. */
static void touch(const char *path)
{
	char cmd[1200];
	ck_assert_int_lt(snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\" && : > '%s'", path,
	                          path), (int)sizeof cmd);
	ck_assert_int_eq(system(cmd), 0);
}

static const char *real(const char *path)
{
	static char buf[PATH_MAX];
	ck_assert_ptr_nonnull(realpath(path, buf));
	return buf;
}

static char out[PATH_MAX];
static kiln_error err;

static kiln_status find(const char *env, const char *exe, const char *lib, const char *build,
                        const char *installed)
{
	cg_rt_search w = {env, exe, lib, build, installed};
	memset(out, 0, sizeof out);
	err = (kiln_error){0};
	return cg_runtime_find(&w, out, sizeof out, &err);
}

static void contains(const char *s, const char *part)
{
	ck_assert_msg(strstr(s, part), "'%s' does not contain '%s'", s, part);
}

START_TEST(env_wins_over_an_installed_tree)
{
	tmp_make("kiln_rtpath");
	char exe[512], inst[600], mine[512];
	snprintf(exe, sizeof exe, "%s", tpath("p/bin/kiln"));
	snprintf(inst, sizeof inst, "%s/p/bin/%s/%s", tmpl, KILN_RT_FROM_BIN, KILN_RT_NAME);
	touch(inst);
	snprintf(mine, sizeof mine, "%s", tpath("mine.a"));
	touch(mine);
	ck_assert_int_eq(find(mine, exe, NULL, KILN_RT_GEN_LIB, "/nonexistent"), KILN_OK);
	ck_assert_str_eq(out, mine);
	/* "" is unset: the installed tree's archive */
	ck_assert_int_eq(find("", exe, NULL, KILN_RT_GEN_LIB, "/nonexistent"), KILN_OK);
	ck_assert_str_eq(out, real(inst));
	tmp_remove();
}
END_TEST

START_TEST(a_wrong_env_is_an_error_not_a_fallback)
{
	ck_assert_int_eq(find("/nonexistent/librt.a", NULL, NULL, KILN_RT_GEN_LIB, "/nonexistent"),
	                 KILN_EIO);
	ck_assert_int_eq(err.code, KILN_EIO);
	contains(err.msg, "$KILN_RT_LIB is '/nonexistent/librt.a'");
	/* a folder is no archive either */
	ck_assert_int_eq(find("/tmp", NULL, NULL, KILN_RT_GEN_LIB, "/nonexistent"), KILN_EIO);
}
END_TEST

START_TEST(beside_the_executable_then_beside_the_library)
{
	tmp_make("kiln_rtpath");
	char exe[512], lib[512], by_exe[600], by_lib[600];
	snprintf(exe, sizeof exe, "%s", tpath("a/bin/prog"));
	snprintf(lib, sizeof lib, "%s", tpath("b/lib/libkiln.so.0.1"));
	snprintf(by_lib, sizeof by_lib, "%s/b/lib/%s/%s", tmpl, KILN_RT_FROM_LIB, KILN_RT_NAME);
	touch(by_lib);
	/* nothing beside the program: libkiln.so's */
	ck_assert_int_eq(find(NULL, exe, lib, KILN_RT_GEN_LIB, "/nonexistent"), KILN_OK);
	ck_assert_str_eq(out, real(by_lib));
	/* the executable's own tree comes first */
	snprintf(by_exe, sizeof by_exe, "%s/a/bin/%s/%s", tmpl, KILN_RT_FROM_BIN, KILN_RT_NAME);
	touch(by_exe);
	ck_assert_int_eq(find(NULL, exe, lib, KILN_RT_GEN_LIB, "/nonexistent"), KILN_OK);
	ck_assert_str_eq(out, real(by_exe));
	tmp_remove();
}
END_TEST

START_TEST(the_build_tree_before_the_prefix_only_from_the_build_tree)
{
	tmp_make("kiln_rtpath");
	char build_exe[PATH_MAX], prefix[512], inst[600];
	snprintf(build_exe, sizeof build_exe, "%s/kiln", KILN_BIN);
	snprintf(prefix, sizeof prefix, "%s", tpath("usr/lib/kiln"));
	snprintf(inst, sizeof inst, "%s/%s", prefix, KILN_RT_NAME);
	touch(inst);
	char build_rt[PATH_MAX];
	snprintf(build_rt, sizeof build_rt, "%s", real(KILN_RT_GEN_LIB));
	/* a program in the build tree takes the build tree's archive ... */
	ck_assert_int_eq(find(NULL, build_exe, NULL, KILN_RT_GEN_LIB, prefix), KILN_OK);
	ck_assert_str_eq(out, build_rt);
	/* ... and so does one linking the build tree's libkiln.so */
	char build_lib[PATH_MAX];
	snprintf(build_lib, sizeof build_lib, "%s/libkiln.so", KILN_BIN);
	ck_assert_int_eq(find(NULL, tpath("x/prog"), build_lib, KILN_RT_GEN_LIB, prefix), KILN_OK);
	ck_assert_str_eq(out, build_rt);
	/* one elsewhere, linked with libkiln.a, takes the prefix's */
	ck_assert_int_eq(find(NULL, tpath("x/prog"), NULL, KILN_RT_GEN_LIB, prefix), KILN_OK);
	ck_assert_str_eq(out, real(inst));
	/* and the build tree's when the prefix has none */
	ck_assert_int_eq(find(NULL, tpath("x/prog"), NULL, KILN_RT_GEN_LIB, "/nonexistent"),
	                 KILN_OK);
	ck_assert_str_eq(out, build_rt);
	tmp_remove();
}
END_TEST

START_TEST(none_found_lists_every_path_tried)
{
	ck_assert_int_eq(find(NULL, "/nowhere/bin/kiln", "/elsewhere/lib/libkiln.so",
	                      "/gone/build/libkilnrt_gen.a", "/usr/nolib/kiln"), KILN_EIO);
	contains(err.msg, "cannot find the runtime archive " KILN_RT_NAME);
	contains(err.msg, "$KILN_RT_LIB (not set)");
	contains(err.msg, "/nowhere/bin/" KILN_RT_FROM_BIN "/" KILN_RT_NAME);
	contains(err.msg, "/elsewhere/lib/" KILN_RT_FROM_LIB "/" KILN_RT_NAME);
	contains(err.msg, "/usr/nolib/kiln/" KILN_RT_NAME);
	contains(err.msg, "/gone/build/libkilnrt_gen.a");
	contains(err.msg, "set KILN_RT_LIB");
	ck_assert_str_eq(out, "");
}
END_TEST

/* The public call reports what this test program would link: it runs from
 * the build tree, so the build tree's archive. */
START_TEST(kiln_runtime_archive_from_the_build_tree)
{
	char buf[PATH_MAX];
	kiln_error e = {0};
	unsetenv("KILN_RT_LIB");
	ck_assert_int_eq(kiln_runtime_archive(buf, sizeof buf, &e), KILN_OK);
	ck_assert_str_eq(buf, real(KILN_RT_GEN_LIB));
	ck_assert_int_eq(kiln_runtime_archive(NULL, 0, &e), KILN_EINVAL);
}
END_TEST

/* ---- the link's messages ---------------------------------------------- */

START_TEST(a_failed_tool_is_named_with_its_output_and_command)
{
	char *argv[] = {"sh", "-c", "echo first line; echo second >&2; exit 3", NULL};
	kiln_error e = {0};
	ck_assert_int_eq(cg_run_tool("out/m.so", argv, &e), KILN_EIO);
	ck_assert_str_eq(e.msg, "out/m.so: linking failed: 'sh' exited with status 3: first "
	                 "line;second; the command: sh -c 'echo first line; echo second >&2; "
	                 "exit 3'");
}
END_TEST

START_TEST(a_tool_killed_or_missing_is_named)
{
	char *killed[] = {"sh", "-c", "kill -9 $$", NULL};
	kiln_error e = {0};
	ck_assert_int_eq(cg_run_tool("m.so", killed, &e), KILN_EIO);
	contains(e.msg, "m.so: linking failed: 'sh' was killed by signal 9: (it printed nothing)");
	char *missing[] = {"/nonexistent/cc", "-shared", NULL};
	ck_assert_int_eq(cg_run_tool("m.so", missing, &e), KILN_EIO);
	contains(e.msg, "m.so: cannot run the linker '/nonexistent/cc': No such file");
}
END_TEST

START_TEST(an_empty_argument_is_refused_before_the_tool_runs)
{
	tmp_make("kiln_rtpath");
	char so[256];
	snprintf(so, sizeof so, "%s", tpath("x.so"));
	char *argv[] = {"cc", "-shared", "-o", so, "", NULL};
	kiln_error e = {0};
	ck_assert_int_eq(cg_run_tool("x.so", argv, &e), KILN_EINVAL);
	contains(e.msg, "x.so: cannot link: argument 4 of 'cc' is empty");
	char *ok[] = {"true", NULL};
	ck_assert_int_eq(cg_run_tool("x.so", ok, &e), KILN_OK);
	tmp_remove();
}
END_TEST

static Suite *rtpath_suite(void)
{
	Suite *s = suite_create("rtpath");
	TCase *tc = tcase_create("search");
	tcase_add_test(tc, env_wins_over_an_installed_tree);
	tcase_add_test(tc, a_wrong_env_is_an_error_not_a_fallback);
	tcase_add_test(tc, beside_the_executable_then_beside_the_library);
	tcase_add_test(tc, the_build_tree_before_the_prefix_only_from_the_build_tree);
	tcase_add_test(tc, none_found_lists_every_path_tried);
	tcase_add_test(tc, kiln_runtime_archive_from_the_build_tree);
	suite_add_tcase(s, tc);
	tc = tcase_create("link_messages");
	tcase_add_test(tc, a_failed_tool_is_named_with_its_output_and_command);
	tcase_add_test(tc, a_tool_killed_or_missing_is_named);
	tcase_add_test(tc, an_empty_argument_is_refused_before_the_tool_runs);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(rtpath_suite)
