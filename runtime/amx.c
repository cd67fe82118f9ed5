/*
 * amx.c: whether this process may use AMX's tile registers.
 *
 * Linux enables the tile data state (XTILEDATA, 8 KiB per thread) only
 * for a process that asks for it (arch_prctl ARCH_REQ_XCOMP_PERM, Linux
 * 5.16 on); a tile instruction before that traps.  The permission is
 * process-wide and once granted cannot be revoked, so the answer is kept
 * in one static flag: the only global state of the runtime, and a cache
 * of the kernel's, not the library's.  A generated kiln_qgemm compiled for
 * a CPU with AMX asks here on every call and takes its AVX512-VNNI path
 * when the answer is no (an older kernel, a CPU without AMX, a sandbox
 * that forbids the call), so a library never traps for want of it.
 * $KILN_AMX=0 says no without asking: the VNNI path on an AMX machine,
 * for tests and comparisons.  Each library links its own copy of this
 * file, so the variable is read when a library's first 8-bit GEMM runs.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "runtime/model.h"

enum {
	ARCH_REQ_XCOMP_PERM = 0x1023, /* arch/x86/include/uapi/asm/prctl.h */
	XFEATURE_XTILEDATA = 18,
};

static _Atomic int amx_state; /* 0: not asked yet, 1: granted, -1: refused */

int rt_amx_ready(void)
{
	int s = atomic_load_explicit(&amx_state, memory_order_acquire);
	if (s == 0) {
		const char *off = getenv("KILN_AMX");
		if (off && strcmp(off, "0") == 0)
			s = -1;
#if defined(__linux__) && defined(__x86_64__)
		else
			s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
#else
		else
			s = -1;
#endif
		atomic_store_explicit(&amx_state, s, memory_order_release);
	}
	return s > 0;
}
