/*
 * frontend.h: helpers shared by the layers and losses built on the IR's
 * node builders (ir/build.h), private to frontend/ and the driver built on
 * it (driver/train.c derives its train-mode graph with fe_bn_batch_stats).
 */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "ir/build.h"

/* ---- layers.c ------------------------------------------------------------ */

typedef struct fe_bn_stats {
	kiln_value mean, var; /* [C]: what BatchNormalization reads */
	kiln_value unbiased;  /* var n/(n-1): what running_var tracks */
} fe_bn_stats;

/* Batch statistics of x over every axis but 1, of dtype dt, as PyTorch's
 * training-mode batch norm takes them (kiln_batchnorm in train mode and
 * `kiln train`'s derived graph).  Composed from ops, so gradients flow
 * through them.  A failure is recorded in g as by any builder: check g's
 * status before using the values. */
fe_bn_stats fe_bn_batch_stats(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype dt);
/* The same over a batch split across ranks (SyncBatchNorm): the two sums,
 * of x and of (x - mean)^2, become outputs "<name>.sync_sum" and
 * "<name>.sync_sqsum" that the split step all-reduces in place as soon as
 * they are made (docs/DISTRIBUTED.md), and the count is ranks times this
 * rank's.  ranks 1 is fe_bn_batch_stats. */
fe_bn_stats fe_bn_batch_stats_sync(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype dt,
                                   int ranks, const char *name);

#endif /* KILN_FRONTEND_H */
