/*
 * comm.c: the engine-independent half of the communication interface
 * (kiln_comm in kiln.h): the gradient hook that data-parallel training
 * passes to kiln_model_train_step_hook.  Each bucket's all-reduce starts as
 * soon as backward has finished it, so communication overlaps the rest of
 * backward (DDP's reducer); wait lets the optimizer in once all are done.
 * The engines themselves (runtime/mpi/comm_mpi.c) live in libraries of
 * their own, so nothing here, nor any generated library, links MPI.
 */
#include "kiln/kiln.h"

static kiln_status hook_ready(void *ud, int bucket, void *data, int64_t n, kiln_dtype dt)
{
	kiln_comm *c = ud;
	(void)bucket;
	return c->size > 1 ? c->allreduce_mean_start(c, data, n, dt) : KILN_OK;
}

static kiln_status hook_wait(void *ud)
{
	kiln_comm *c = ud;
	return c->wait(c, c->step);
}

static kiln_status hook_sum(void *ud, void *data, int64_t n, kiln_dtype dt)
{
	kiln_comm *c = ud;
	return c->size > 1 ? c->allreduce_sum(c, data, n, dt) : KILN_OK;
}

KILN_API kiln_grad_hook kiln_comm_grad_hook(kiln_comm *c)
{
	return (kiln_grad_hook){hook_ready, hook_wait, c, hook_sum};
}
