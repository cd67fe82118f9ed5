/* check_main.h: the main() every Check test executable shares.
 * CK_RUN_SUITE / CK_RUN_CASE pick a subset, as Check documents. */
#ifndef KILN_CHECK_MAIN_H
#define KILN_CHECK_MAIN_H
#include <check.h>
#include <stdlib.h>

#define KILN_CHECK_MAIN(suite_fn)                                  \
	int main(void)                                             \
	{                                                          \
		SRunner *r = srunner_create(suite_fn());           \
		srunner_run_all(r, CK_NORMAL);                     \
		int failed = srunner_ntests_failed(r);             \
		srunner_free(r);                                   \
		return failed ? EXIT_FAILURE : EXIT_SUCCESS;       \
	}
#endif
