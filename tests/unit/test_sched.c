/*
 * test_sched.c: the learning-rate schedules of runtime/sched.c against
 * torch.optim.lr_scheduler's values (tests/fixtures/train/sched_*.npy from
 * make_train_fixtures.py: the lr each of 30 optimizer steps used), and the
 * refusal of schedules PyTorch would refuse.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "kiln/kiln.h"

/* Asserts kiln_sched_lr(s, i) equals the fixture's lr i to 1e-12 relative. */
static void against(const char *name, const kiln_sched *s)
{
	char path[512];
	snprintf(path, sizeof path, "%s/train/sched_%s.npy", KILN_FIXTURES, name);
	kiln_tensor *t = NULL;
	kiln_error err;
	ck_assert_int_eq(kiln_npy_read(path, &t, &err), KILN_OK);
	ck_assert_int_eq(t->dtype, KILN_F64);
	ck_assert_int_eq(kiln_tensor_numel(t), 30);
	ck_assert_int_eq(kiln_sched_check(s, &err), KILN_OK);
	const double *want = t->data;
	for (int i = 0; i < 30; i++) {
		double got = kiln_sched_lr(s, i);
		ck_assert_msg(fabs(got - want[i]) <= 1e-12 * fabs(want[i]) + 1e-15,
		              "%s step %d: kiln %.17g, torch %.17g", name, i, got, want[i]);
	}
	kiln_tensor_free(t);
}

START_TEST(step_lr_matches_torch)
{
	against("step", &(kiln_sched){.kind = KILN_SCHED_STEP, .base_lr = 0.1, .step_size = 7,
	                              .gamma = 0.5});
}
END_TEST

START_TEST(cosine_matches_torch_past_t_max)
{
	against("cosine", &(kiln_sched){.kind = KILN_SCHED_COSINE, .base_lr = 0.1, .t_max = 10,
	                                .eta_min = 1e-3});
}
END_TEST

START_TEST(onecycle_matches_torch)
{
	against("onecycle", &(kiln_sched){.kind = KILN_SCHED_ONECYCLE, .base_lr = 0.5,
	                                  .total_steps = 30});
}
END_TEST

START_TEST(onecycle_three_phase_linear_matches_torch)
{
	against("onecycle3", &(kiln_sched){.kind = KILN_SCHED_ONECYCLE, .base_lr = 0.5,
	                                   .total_steps = 30, .pct_start = 0.25,
	                                   .div_factor = 10, .final_div_factor = 100,
	                                   .anneal_linear = true, .three_phase = true});
}
END_TEST

START_TEST(linear_matches_torch)
{
	against("linear", &(kiln_sched){.kind = KILN_SCHED_LINEAR, .base_lr = 0.1,
	                                .start_factor = 0.25, .total_steps = 8});
}
END_TEST

START_TEST(warmup_then_cosine_matches_sequential_lr)
{
	against("warmup_cosine", &(kiln_sched){.kind = KILN_SCHED_COSINE, .base_lr = 0.1,
	                                       .t_max = 20, .warmup_steps = 5,
	                                       .warmup_start_factor = 0.1});
}
END_TEST

START_TEST(constant_is_base_lr)
{
	kiln_sched s = {.kind = KILN_SCHED_CONSTANT, .base_lr = 0.25};
	ck_assert_double_eq(kiln_sched_lr(&s, 0), 0.25);
	ck_assert_double_eq(kiln_sched_lr(&s, 1000), 0.25);
}
END_TEST

START_TEST(onecycle_holds_last_value_past_total)
{
	kiln_sched s = {.kind = KILN_SCHED_ONECYCLE, .base_lr = 0.5, .total_steps = 30};
	ck_assert_double_eq(kiln_sched_lr(&s, 29), kiln_sched_lr(&s, 100));
	ck_assert_double_eq_tol(kiln_sched_lr(&s, 29), 0.5 / 25 / 1e4, 1e-15);
}
END_TEST

/* ---- refusals ---------------------------------------------------------- */

START_TEST(step_lr_rejects_zero_step_size)
{
	kiln_error err;
	kiln_sched s = {.kind = KILN_SCHED_STEP, .base_lr = 0.1};
	ck_assert_int_eq(kiln_sched_check(&s, &err), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "step_size > 0"));
	ck_assert(isnan(kiln_sched_lr(&s, 3)));
}
END_TEST

START_TEST(sched_rejects_bad_kind_and_lr)
{
	kiln_error err;
	ck_assert_int_eq(kiln_sched_check(&(kiln_sched){.kind = (kiln_sched_kind)42}, &err),
	                 KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "unknown kind"));
	ck_assert_int_eq(kiln_sched_check(&(kiln_sched){.base_lr = -1}, &err), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "base_lr"));
	ck_assert_int_eq(kiln_sched_check(NULL, &err), KILN_EINVAL);
	ck_assert(isnan(kiln_sched_lr(NULL, 0)));
}
END_TEST

START_TEST(onecycle_rejects_pct_start_of_one)
{
	kiln_error err;
	kiln_sched s = {.kind = KILN_SCHED_ONECYCLE, .base_lr = 1, .total_steps = 10,
	                .pct_start = 1};
	ck_assert_int_eq(kiln_sched_check(&s, &err), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "pct_start"));
}
END_TEST

static Suite *sched_suite(void)
{
	Suite *s = suite_create("sched");
	TCase *tc = tcase_create("torch_parity");
	tcase_add_test(tc, step_lr_matches_torch);
	tcase_add_test(tc, cosine_matches_torch_past_t_max);
	tcase_add_test(tc, onecycle_matches_torch);
	tcase_add_test(tc, onecycle_three_phase_linear_matches_torch);
	tcase_add_test(tc, linear_matches_torch);
	tcase_add_test(tc, warmup_then_cosine_matches_sequential_lr);
	tcase_add_test(tc, constant_is_base_lr);
	tcase_add_test(tc, onecycle_holds_last_value_past_total);
	suite_add_tcase(s, tc);
	tc = tcase_create("refusals");
	tcase_add_test(tc, step_lr_rejects_zero_step_size);
	tcase_add_test(tc, sched_rejects_bad_kind_and_lr);
	tcase_add_test(tc, onecycle_rejects_pct_start_of_one);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(sched_suite)
