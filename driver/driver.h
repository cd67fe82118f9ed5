/*
 * driver.h: the driver's header for the `kiln` CLI (tools/), beside the
 * public API; nothing below the driver includes it.
 *
 * The drivers (compile.c: kiln_compile, kiln_compile_train; train_cache.c:
 * driver_train_lib, kiln train's cached compiled step; train.c:
 * kiln_build_train_step, kiln_train_graph_from_inference, kiln_trainer) are
 * declared in include/kiln/kiln.h.  The CLI reads graphs, runs passes and
 * sniffs files through kiln.h too (kiln_graph_param, kiln_graph_op_histogram,
 * kiln_graph_run_passes, kiln_file_sniff...).  What is here is a step of the
 * CLI's own that needs the graph's nodes, done by the driver (cli.c).
 *
 * This header includes kiln/kiln.h and nothing of ir/, passes/ or
 * runtime/, and tools/ includes kiln/kiln.h, this header and its own only:
 * tests/layers/check_layers.py holds both, and that tools/ calls nothing
 * but kiln.h's functions and the driver's.
 */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include "kiln/kiln.h"

/* `kiln compile --train` of an inference-mode model file: the train-mode
 * form of inference (kiln_train_graph_from_inference with seed) compiled
 * by kiln_compile_train with inference as the eval program (a training-mode
 * export's inference model, kiln_inference_graph_from_train).  When that
 * fails because a conv's weight gradient needs the batch fixed and batch
 * is 0, err says so, naming the model's first convolution and asking for
 * --batch N, instead of the lowering's "symbolic channel counts". */
kiln_status driver_compile_train_inference(const kiln_graph *inference, uint64_t seed,
                                           const kiln_train_opts *t, int64_t batch,
                                           const char *out_path, const kiln_compile_opts *o,
                                           kiln_error *err);

/* kiln_build_train_step; with grad_outputs, every gradient is also an
 * output "<p>.grad" after the model's ".next" ones, in the order backward
 * makes them (the last layer's first): what kiln_compile_train builds so
 * that the step can stop between the gradients and the optimizer (the
 * split step, kiln_model_train_step_hook). */
kiln_status driver_build_train_step(const kiln_graph *model, const kiln_train_opts *o,
                                    bool grad_outputs, kiln_graph **step, kiln_error *err);

/* kiln_train_graph_from_inference for data-parallel training over ranks
 * processes with synchronised BatchNorm (`kiln train --sync-bn`): each
 * BatchNorm's batch sums are outputs "<running_mean>.sync_sum" and
 * ".sync_sqsum" over ranks times the rows (fe_bn_batch_stats_sync), which
 * the compiled step all-reduces, with their gradients, through the hook
 * (kiln_grad_hook.sum).  ranks 1 is kiln_train_graph_from_inference. */
kiln_status driver_train_graph_sync_bn(const kiln_graph *inference, uint64_t seed, int ranks,
                                       kiln_graph **train, kiln_error *err);

/* What driver_train_lib found in the cache. */
typedef struct driver_cache_info {
	bool hit;        /* loaded from the cache, nothing compiled */
	bool rebuilt;    /* an entry was there but torn or altered: compiled again */
	char path[4200]; /* the entry ("" when there is no cache folder) */
} driver_cache_info;

/* `kiln train`'s compiled step: kiln_compile_train(train, eval, t, batch)
 * through a cache of libraries keyed by a hash of both graphs' text, t,
 * batch, the target CPU and features and this build of kiln (not the
 * parameters' data: set the state after loading), in cache_dir (NULL: the
 * default folder, see kiln_compile_opts.cache_dir; "": no cache, a
 * temporary file), then kiln_load.  Entries are written atomically with a
 * hash of their bytes, checked before every load; a bad one is rebuilt. */
kiln_status driver_train_lib(const kiln_graph *train, const kiln_graph *eval,
                             const kiln_train_opts *t, int64_t batch, const char *cache_dir,
                             kiln_model **m, driver_cache_info *info, kiln_error *err);

#endif /* KILN_DRIVER_H */
