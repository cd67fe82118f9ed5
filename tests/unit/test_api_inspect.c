/* test_api_inspect.c: what kiln.h gives a client that reads graphs it did
 * not build (the `kiln` CLI is one, through kiln.h and driver.h only):
 * parameters one by one, buffers, the op histogram, types with symbols,
 * the pass registry and file kinds.  Only kiln/kiln.h is included. */
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"

#include "check_main.h"
#include "tmpdir.h"

/* x:f32[N,4] -> linear fc (w, b) -> relu -> relu -> y; a buffer "count". */
static kiln_graph *g;
static kiln_value x;

static void setup(void)
{
	g = kiln_graph_new("api");
	x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 4});
	kiln_value h = kiln_relu(g, kiln_relu(g, kiln_linear(g, "fc", x, 3, true)));
	kiln_output(g, "y", h);
	int64_t zero = 0;
	kiln_buffer(g, "count", &(kiln_tensor){KILN_I64, 0, {0}, &zero});
	ck_assert_int_eq(kiln_graph_status(g), KILN_OK);
}

static void teardown(void)
{
	kiln_graph_free(g);
}

START_TEST(params_in_order_with_data_and_trainable)
{
	ck_assert_int_eq(kiln_graph_num_params(g), 3);
	const char *want[] = {"fc.weight", "fc.bias", "count"};
	for (int i = 0; i < 3; i++) {
		kiln_value p = kiln_graph_param(g, i);
		ck_assert_str_eq(kiln_value_name(g, p), want[i]);
		ck_assert_int_eq(kiln_param_trainable(g, p), i < 2);
		ck_assert_ptr_nonnull(kiln_param_data(g, p));
	}
	ck_assert_int_eq(kiln_graph_param(g, 3), KILN_NONE);
	ck_assert_int_eq(kiln_graph_param(g, -1), KILN_NONE);
	ck_assert_ptr_null(kiln_param_data(g, x)); /* an input is no parameter */
	/* written in place, read back by name */
	kiln_tensor *t = kiln_param_data(g, kiln_graph_find_param(g, "count"));
	*(int64_t *)t->data = 7;
	kiln_tensor_set *s = kiln_graph_params(g);
	ck_assert_int_eq(kiln_tensor_get_i64(kiln_tensor_set_get(s, "count"), 0), 7);
	kiln_tensor_set_free(s);
}
END_TEST

START_TEST(buffer_name_clash_is_recorded)
{
	int64_t one = 1;
	ck_assert_int_eq(kiln_buffer(g, "fc.bias", &(kiln_tensor){KILN_I64, 0, {0}, &one}), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "Buffer: the name 'fc.bias'"));
}
END_TEST

START_TEST(histogram_counts_live_nodes_most_first)
{
	kiln_op_count h[KILN_OP_KINDS];
	int nodes = -1;
	int n = kiln_graph_op_histogram(g, h, KILN_OP_KINDS, &nodes);
	ck_assert_int_ge(n, 2);
	ck_assert_str_eq(h[0].op, "relu");
	ck_assert_int_eq(h[0].count, 2);
	int sum = 0;
	for (int i = 0; i < n; i++) {
		sum += h[i].count;
		if (i)
			ck_assert(h[i - 1].count > h[i].count ||
			          (h[i - 1].count == h[i].count && strcmp(h[i - 1].op, h[i].op) < 0));
	}
	ck_assert_int_eq(sum, nodes);
	ck_assert_int_eq(kiln_graph_op_histogram(g, NULL, 0, NULL), n); /* the size alone */
	ck_assert_int_eq(kiln_graph_op_histogram(NULL, h, KILN_OP_KINDS, &nodes), 0);
}
END_TEST

START_TEST(types_print_with_symbols)
{
	char buf[64];
	int64_t dims[2] = {kiln_value_dim(g, x, 0), 3};
	ck_assert_str_eq(kiln_type_str(g, KILN_I64, 2, dims, buf, sizeof buf), "i64[N,3]");
	ck_assert_str_eq(kiln_type_str(g, KILN_F32, 0, NULL, buf, sizeof buf), "f32[]");
	ck_assert_str_eq(kiln_type_str(g, KILN_F32, -1, NULL, buf, sizeof buf), "?");
	ck_assert_str_eq(kiln_graph_loc(g).file, __FILE__);
	kiln_tensor *t = kiln_tensor_new(KILN_F16, 1, (int64_t[]){1});
	((uint16_t *)t->data)[0] = 0x3e00; /* 1.5 */
	ck_assert(kiln_tensor_get(t, 0) == 1.5);
	ck_assert_int_eq(kiln_tensor_get_i64(t, 0), 1);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(pass_registry_lists_and_runs_by_name)
{
	ck_assert_int_gt(kiln_pass_count(), 0);
	for (int i = 0; i < kiln_pass_count(); i++) {
		ck_assert(kiln_pass_known(kiln_pass_name(i)));
		ck_assert_ptr_nonnull(kiln_pass_desc(i));
	}
	ck_assert_ptr_null(kiln_pass_name(kiln_pass_count()));
	ck_assert(!kiln_pass_known("nosuch") && !kiln_pass_known(NULL));
	ck_assert_str_eq(kiln_pass_default(), "infer,fold,cse,dce");
	kiln_error e = {0};
	ck_assert_int_eq(kiln_graph_run_passes(g, "dce,nosuch", NULL, &e), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "unknown pass 'nosuch'"));
	FILE *dump = tmpfile();
	kiln_pass_opts o = {.verify = true, .dump_after = "cse", .dump = dump};
	ck_assert_int_eq(kiln_graph_run_passes(g, "default", &o, &e), KILN_OK);
	ck_assert_int_gt(ftell(dump), 0); /* the IR after cse */
	fclose(dump);
	ck_assert_int_eq(kiln_graph_run_passes(g, "", NULL, &e), KILN_OK);
}
END_TEST

START_TEST(files_are_sniffed_by_content)
{
	tmp_make("kiln_api");
	const char *path = tpath("model.bin");
	kiln_error e = {0};
	ck_assert_int_eq(kiln_graph_save(g, path, &e), KILN_OK);
	ck_assert_int_eq(kiln_file_sniff(path), KILN_FILE_KIR);
	path = tpath("a.kir"); /* the name says .kir, the bytes say .npy */
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, (int64_t[]){2});
	ck_assert_int_eq(kiln_npy_write(path, t, &e), KILN_OK);
	kiln_tensor_free(t);
	ck_assert_int_eq(kiln_file_sniff(path), KILN_FILE_NPY);
	ck_assert_int_eq(kiln_file_sniff(tpath("")), KILN_FILE_UNKNOWN);
	ck_assert_int_eq(kiln_file_sniff(NULL), KILN_FILE_UNKNOWN);
	ck_assert_str_eq(kiln_file_kind_name(KILN_FILE_ELF), "a compiled library (ELF shared object)");
	ck_assert_str_eq(kiln_file_kind_name((kiln_file_kind)99), "?");
	tmp_remove();
}
END_TEST

static Suite *api_inspect_suite(void)
{
	Suite *s = suite_create("api_inspect");
	TCase *tc = tcase_create("graph");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, params_in_order_with_data_and_trainable);
	tcase_add_test(tc, buffer_name_clash_is_recorded);
	tcase_add_test(tc, histogram_counts_live_nodes_most_first);
	tcase_add_test(tc, types_print_with_symbols);
	tcase_add_test(tc, pass_registry_lists_and_runs_by_name);
	tcase_add_test(tc, files_are_sniffed_by_content);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(api_inspect_suite)
