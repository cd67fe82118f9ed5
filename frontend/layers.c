/*
 * layers.c: PyTorch-style layers traced from the DSL's ops, registering
 * their parameters under torch.nn's state_dict names.
 *
 * A layer named "fc1" owns "fc1.weight" and "fc1.bias", shaped and
 * initialised as torch.nn initialises them (from the graph's seeded
 * generator, so the same seed gives the same weights), which is what lets a
 * PyTorch state_dict saved as safetensors load by name.  Like every DSL call,
 * a layer that fails rolls the graph back to a mark, parameters included.
 *
 * Decisions others rely on:
 *  - Linear is Gemm(x, W, b, transB=1) for 2-D x, else MatMul(x, W^T) (+ b),
 *    with W kept in PyTorch's [out, in] layout behind a Transpose.
 *  - BatchNorm keeps "weight", "bias", and the buffers (trainable=false)
 *    "running_mean", "running_var" and "num_batches_tracked" (an i64
 *    scalar, unused by the forward pass but part of every state_dict).
 *    Eval mode traces BatchNormalization with the running statistics.  Train
 *    mode (kiln_graph_set_training) composes PyTorch's train-mode batch norm
 *    from ReduceSum and the inference-mode op fed the batch statistics
 *    (see bn_train), and the updated statistics become graph
 *    outputs named after the buffer they replace plus ".next":
 *    "bn1.running_mean.next", "bn1.running_var.next" and
 *    "bn1.num_batches_tracked.next" (= old + 1).  A training step therefore
 *    finds its state updates by name: for each output "<p>.next", <p> is a
 *    buffer to overwrite after the step.  They are appended when the layer
 *    is traced, so they come before outputs added later.  running_var is
 *    updated with the unbiased batch variance, as PyTorch does (ONNX's
 *    training-mode BatchNormalization would use the biased one).
 *  - Dropout follows the graph's training flag; its seed is drawn from the
 *    graph's generator so each dropout layer gets its own stream.
 *  - Zero eps or momentum means PyTorch's defaults (1e-5, 0.1).
 *  - Pool layers default the stride to the kernel, as PyTorch does; pads are
 *    symmetric from o->pad[0..nsp).  PyTorch's AvgPool2d counts padding by
 *    default: set o->count_include_pad to match it when padding.
 *  - The main node of a layer is named after the layer, for dumps.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "frontend/frontend.h"

/* ---- parameters ---------------------------------------------------------- */

typedef enum { UNIFORM, NORMAL, FILL } init_kind;

/* Registers "<layer>.<suffix>" with the given shape, filled with U(-a, a),
 * N(0, 1) or the constant a. */
static kiln_value param(kiln_graph *g, kiln_loc loc, const char *layer, const char *suffix,
                        kiln_dtype dt, int rank, const int64_t *dims, init_kind how,
                        double a, bool trainable)
{
	if (g->status != KILN_OK)
		return KILN_NONE;
	char name[512];
	if (snprintf(name, sizeof name, "%s.%s", layer, suffix) >= (int)sizeof name) {
		ir_errorf_at(g, loc, KILN_EINVAL, "layer name '%.40s...' is too long", layer);
		return KILN_NONE;
	}
	if (ir_name_taken(g, name)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "parameter '%s' already exists (two layers named "
		             "'%s'?)", name, layer);
		return KILN_NONE;
	}
	kiln_tensor *t = kiln_tensor_new(dt, rank, dims);
	if (!t) {
		ir_errorf_at(g, loc, KILN_ENOMEM, "parameter '%s': cannot allocate", name);
		return KILN_NONE;
	}
	for (int64_t i = 0, n = kiln_tensor_numel(t); i < n; i++) {
		double v = how == UNIFORM ? a * (2 * ir_rand_uniform(g) - 1)
		           : how == NORMAL ? ir_rand_normal(g)
		                           : a;
		ir_store(t, i, v);
	}
	kiln_value id = ir_param_new(g, name, t, trainable);
	kiln_tensor_free(t);
	if (!id)
		ir_errorf_at(g, loc, KILN_ENOMEM, "parameter '%s': out of memory", name);
	return id;
}

/* The dtype parameters take: the input's when it is a float, else f32. */
static kiln_dtype pdtype(const ir_type *t)
{
	return kiln_dtype_is_float(t->dtype) ? t->dtype : KILN_F32;
}

/* ---- shared checks and the rollback at the end of each layer --------------- */

/* x's type when the graph is fine, name is usable, x is a value of rank
 * [rmin, rmax] and its dim feat (negative: from the end) is fixed. */
static const ir_type *layer_in(kiln_graph *g, kiln_loc loc, const char *kind, const char *name,
                               kiln_value x, int rmin, int rmax, int feat)
{
	if (!g || g->status != KILN_OK)
		return NULL;
	if (!name || !*name) {
		ir_errorf_at(g, loc, KILN_EINVAL, "%s: a layer needs a name", kind);
		return NULL;
	}
	const ir_value *p = ir_operand(g, loc, kind, "input", x);
	if (!p)
		return NULL;
	const ir_type *t = &p->type;
	int ax = feat < 0 ? feat + t->rank : feat;
	char buf[256];
	if (t->rank < rmin || t->rank > rmax || ax < 0 || ax >= t->rank || t->dim[ax] < 0) {
		ir_errorf_at(g, loc, KILN_ESHAPE, "%s '%s': input %s must have rank %d..%d with a "
		             "fixed size at dim %d", kind, name, ir_type_str(g, t, buf, sizeof buf),
		             rmin, rmax, feat);
		return NULL;
	}
	return t;
}

/* Ends a layer: on error undoes everything since m, else names y's node. */
static kiln_value done(kiln_graph *g, ir_mark m, kiln_value y, const char *name)
{
	if (g->status != KILN_OK || !y) {
		ir_rollback(g, m);
		return KILN_NONE;
	}
	ir_value *v = g->val[y];
	if (v->kind == IR_V_NODE && !v->def->name)
		v->def->name = ir_intern(g, name);
	return y;
}

static bool positive(kiln_graph *g, kiln_loc loc, const char *kind, const char *name,
                     const char *what, int64_t n)
{
	if (n <= 0)
		ir_errorf_at(g, loc, KILN_EINVAL, "%s '%s': %s must be positive, got %lld", kind,
		             name, what, (long long)n);
	return n > 0;
}

/* ---- Linear, Conv ----------------------------------------------------------- */

KILN_API kiln_value kiln_linear_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                   int64_t out_features, bool bias)
{
	const ir_type *t = layer_in(g, loc, "Linear", name, x, 1, KILN_MAX_RANK, -1);
	if (!t || !positive(g, loc, "Linear", name, "out_features", out_features))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	int rank = t->rank;
	int64_t in = t->dim[rank - 1];
	double bound = in > 0 ? 1 / sqrt((double)in) : 0; /* kaiming_uniform(a=sqrt(5)) */
	kiln_dtype dt = pdtype(t);
	kiln_value w = param(g, loc, name, "weight", dt, 2, (int64_t[]){out_features, in},
	                     UNIFORM, bound, true);
	kiln_value b = bias ? param(g, loc, name, "bias", dt, 1, &out_features, UNIFORM, bound,
	                            true)
	                    : KILN_NONE;
	kiln_value y;
	if (rank == 2) {
		y = kiln_gemm_at(g, loc, x, w, b, 1.0, 1.0, false, true);
	} else {
		kiln_value wt = kiln_transpose_at(g, loc, w, 2, (int64_t[]){1, 0});
		y = kiln_matmul_at(g, loc, x, wt);
		if (bias)
			y = kiln_add_at(g, loc, y, b);
	}
	return done(g, m, y, name);
}

static kiln_value convnd(kiln_graph *g, kiln_loc loc, const char *kind, int nsp,
                         const char *name, kiln_value x, int64_t out, const kiln_conv_opts *o,
                         bool bias)
{
	const ir_type *t = layer_in(g, loc, kind, name, x, nsp + 2, nsp + 2, 1);
	if (!t || !positive(g, loc, kind, name, "out_channels", out))
		return KILN_NONE;
	int64_t group = o && o->group ? o->group : 1, in = t->dim[1];
	int64_t wdim[5] = {out, in / (group > 0 ? group : 1)}, fan_in = wdim[1];
	if (!o) {
		ir_errorf_at(g, loc, KILN_EINVAL, "%s '%s': needs kiln_conv_opts with a kernel", kind,
		             name);
		return KILN_NONE;
	}
	for (int i = 0; i < nsp; i++) {
		if (!positive(g, loc, kind, name, "kernel size", o->kernel[i]))
			return KILN_NONE;
		wdim[2 + i] = o->kernel[i];
		fan_in *= o->kernel[i];
	}
	if (group <= 0 || in % group || out % group) {
		ir_errorf_at(g, loc, KILN_EINVAL, "%s '%s': groups %lld must divide in_channels "
		             "%lld and out_channels %lld", kind, name, (long long)group,
		             (long long)in, (long long)out);
		return KILN_NONE;
	}
	ir_mark m = ir_mark_of(g);
	double bound = fan_in > 0 ? 1 / sqrt((double)fan_in) : 0;
	kiln_dtype dt = pdtype(t);
	kiln_value w = param(g, loc, name, "weight", dt, nsp + 2, wdim, UNIFORM, bound, true);
	kiln_value b = bias ? param(g, loc, name, "bias", dt, 1, &out, UNIFORM, bound, true)
	                    : KILN_NONE;
	kiln_conv_opts c = *o;
	for (int i = 0; i < nsp; i++) /* PyTorch's padding is symmetric */
		c.pad[nsp + i] = o->pad[i];
	return done(g, m, kiln_conv_at(g, loc, x, w, b, &c), name);
}

KILN_API kiln_value kiln_conv1d_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                   int64_t out_channels, const kiln_conv_opts *o, bool bias)
{
	return convnd(g, loc, "Conv1d", 1, name, x, out_channels, o, bias);
}

KILN_API kiln_value kiln_conv2d_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                   int64_t out_channels, const kiln_conv_opts *o, bool bias)
{
	return convnd(g, loc, "Conv2d", 2, name, x, out_channels, o, bias);
}

/* ---- normalisation and embedding --------------------------------------------- */

/* Elements per channel of x (every axis but 1), as a scalar of dtype dt:
 * a constant when those dims are fixed, else computed from Shape(x). */
static kiln_value per_channel(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype dt)
{
	const ir_type *t = &g->val[x]->type;
	int64_t n = 1;
	for (int i = 0; i < t->rank && n >= 0; i++)
		n = i == 1 ? n : t->dim[i] < 0 ? -1 : n * t->dim[i];
	if (n >= 0)
		return kiln_scalar_at(g, loc, dt, (double)n);
	kiln_value shp = kiln_cast_at(g, loc, kiln_shape_of_at(g, loc, x), dt), cnt = KILN_NONE;
	for (int i = 0; i < t->rank; i++) {
		if (i == 1)
			continue;
		kiln_value d = kiln_gather_at(g, loc, shp, kiln_scalar_at(g, loc, KILN_I64, i), 0);
		cnt = cnt ? kiln_mul_at(g, loc, cnt, d) : d;
	}
	return cnt;
}

/* Sums over n rather than ReduceMean, so a symbolic batch works: n comes
 * from Shape(x) then. */
fe_bn_stats fe_bn_batch_stats(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype dt)
{
	return fe_bn_batch_stats_sync(g, loc, x, dt, 1, NULL);
}

/* v as output "<name><suffix>" when syncing (its value is then the sum
 * over ranks); v itself otherwise. */
static kiln_value synced(kiln_graph *g, kiln_loc loc, kiln_value v, const char *name,
                         const char *suffix)
{
	if (!name)
		return v;
	char out[600];
	snprintf(out, sizeof out, "%s%s", name, suffix);
	kiln_value w = kiln_identity_at(g, loc, v);
	kiln_output_at(g, loc, out, w);
	return w;
}

fe_bn_stats fe_bn_batch_stats_sync(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype dt,
                                   int ranks, const char *name)
{
	int64_t axes[KILN_MAX_RANK];
	int na = 0;
	for (int i = 0; i < g->val[x]->type.rank; i++)
		if (i != 1)
			axes[na++] = i;
	name = ranks > 1 ? name : NULL;
	kiln_value n = per_channel(g, loc, x, dt);
	if (name)
		n = kiln_mul_at(g, loc, n, kiln_scalar_at(g, loc, dt, (double)ranks));
	kiln_value s0 = synced(g, loc, kiln_reduce_sum_at(g, loc, x, na, axes, true), name,
	                       ".sync_sum");
	kiln_value mk = kiln_div_at(g, loc, s0, n);
	fe_bn_stats s = {.mean = kiln_squeeze_at(g, loc, mk, na, axes)};
	kiln_value d = kiln_sub_at(g, loc, x, mk);
	kiln_value s1 = synced(g, loc, kiln_reduce_sum_at(g, loc, kiln_mul_at(g, loc, d, d), na,
	                                                  axes, false), name, ".sync_sqsum");
	s.var = kiln_div_at(g, loc, s1, n);
	s.unbiased = kiln_mul_at(g, loc, s.var, kiln_div_at(g, loc, n,
	                         kiln_sub_at(g, loc, n, kiln_scalar_at(g, loc, dt, 1))));
	return s;
}

/* Training-mode batch norm with PyTorch's semantics, composed from ops so
 * gradients flow through the batch statistics by the reductions' own rules:
 * mean and biased var over every axis but 1 feed the inference-mode
 * BatchNormalization, and the buffers update as PyTorch updates them,
 * running = (1 - momentum) running + momentum batch, with the unbiased
 * variance var n/(n-1) (ONNX's training mode would use the biased one).
 * The updates are "<buffer>.next" graph outputs (see the top of the file). */
static kiln_value bn_train(kiln_graph *g, kiln_loc loc, const char *name, const kiln_value *in,
                           kiln_value nbt, double eps, double momentum)
{
	kiln_dtype dt = g->val[in[3]]->type.dtype;
	fe_bn_stats st = fe_bn_batch_stats(g, loc, in[0], dt);
	kiln_value y = kiln_batch_norm_at(g, loc, in[0], in[1], in[2], st.mean, st.var, eps);
	kiln_value keep = kiln_scalar_at(g, loc, dt, 1 - momentum);
	kiln_value mom = kiln_scalar_at(g, loc, dt, momentum);
	kiln_value next[3] = {
		kiln_add_at(g, loc, kiln_mul_at(g, loc, in[3], keep), kiln_mul_at(g, loc, st.mean, mom)),
		kiln_add_at(g, loc, kiln_mul_at(g, loc, in[4], keep),
		            kiln_mul_at(g, loc, st.unbiased, mom)),
		kiln_add_at(g, loc, nbt, kiln_scalar_at(g, loc, KILN_I64, 1)),
	};
	const char *suffix[3] = {"running_mean", "running_var", "num_batches_tracked"};
	for (int i = 0; i < 3 && g->status == KILN_OK; i++) {
		char oname[600];
		snprintf(oname, sizeof oname, "%s.%s.next", name, suffix[i]);
		kiln_output_at(g, loc, oname, next[i]);
	}
	return g->status == KILN_OK ? y : KILN_NONE;
}

KILN_API kiln_value kiln_batchnorm_at(kiln_graph *g, kiln_loc loc, const char *name,
                                      kiln_value x, double eps, double momentum)
{
	const ir_type *t = layer_in(g, loc, "BatchNorm", name, x, 2, KILN_MAX_RANK, 1);
	if (!t)
		return KILN_NONE;
	eps = eps > 0 ? eps : 1e-5;
	momentum = momentum > 0 ? momentum : 0.1;
	ir_mark m = ir_mark_of(g);
	kiln_dtype dt = pdtype(t);
	const int64_t *c = &t->dim[1];
	kiln_value in[5] = {
		x,
		param(g, loc, name, "weight", dt, 1, c, FILL, 1, true),
		param(g, loc, name, "bias", dt, 1, c, FILL, 0, true),
		param(g, loc, name, "running_mean", dt, 1, c, FILL, 0, false),
		param(g, loc, name, "running_var", dt, 1, c, FILL, 1, false),
	};
	kiln_value nbt = param(g, loc, name, "num_batches_tracked", KILN_I64, 0, NULL, FILL, 0,
	                       false);
	kiln_value y = KILN_NONE;
	if (g->status == KILN_OK && g->training)
		y = bn_train(g, loc, name, in, nbt, eps, momentum);
	else if (g->status == KILN_OK)
		y = kiln_batch_norm_at(g, loc, x, in[1], in[2], in[3], in[4], eps);
	return done(g, m, y, name);
}

KILN_API kiln_value kiln_layernorm_at(kiln_graph *g, kiln_loc loc, const char *name,
                                      kiln_value x, int nnorm, double eps)
{
	const ir_type *t = layer_in(g, loc, "LayerNorm", name, x, 1, KILN_MAX_RANK, -1);
	if (!t)
		return KILN_NONE;
	bool ok = nnorm >= 1 && nnorm <= t->rank;
	for (int i = t->rank - nnorm; ok && i < t->rank; i++)
		ok = t->dim[i] >= 0;
	if (!ok) {
		char buf[256];
		ir_errorf_at(g, loc, KILN_ESHAPE, "LayerNorm '%s': cannot normalise the last %d dims "
		             "of %s: they must exist and be fixed", name, nnorm,
		             ir_type_str(g, t, buf, sizeof buf));
		return KILN_NONE;
	}
	ir_mark m = ir_mark_of(g);
	const int64_t *dims = &t->dim[t->rank - nnorm];
	kiln_value w = param(g, loc, name, "weight", pdtype(t), nnorm, dims, FILL, 1, true);
	kiln_value b = param(g, loc, name, "bias", pdtype(t), nnorm, dims, FILL, 0, true);
	kiln_value y = kiln_layer_norm_at(g, loc, x, w, b, -nnorm, eps > 0 ? eps : 1e-5);
	return done(g, m, y, name);
}

KILN_API kiln_value kiln_embedding_at(kiln_graph *g, kiln_loc loc, const char *name,
                                      kiln_value idx, int64_t num, int64_t dim)
{
	if (!g || g->status != KILN_OK)
		return KILN_NONE;
	if (!name || !*name) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Embedding: a layer needs a name");
		return KILN_NONE;
	}
	if (!ir_operand(g, loc, "Embedding", "indices", idx) ||
	    !positive(g, loc, "Embedding", name, "num_embeddings", num) ||
	    !positive(g, loc, "Embedding", name, "embedding_dim", dim))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	kiln_value w = param(g, loc, name, "weight", KILN_F32, 2, (int64_t[]){num, dim}, NORMAL, 0,
	                     true);
	return done(g, m, kiln_gather_at(g, loc, w, idx, 0), name);
}

/* ---- pooling and dropout (used by Sequential) ------------------------------------ */

/* PyTorch's pool geometry as ONNX's: stride defaults to the kernel, pads
 * are symmetric; false (error recorded) without a kernel. */
static bool pool_opts(kiln_graph *g, kiln_loc loc, const char *kind, const char *name,
                      const kiln_conv_opts *o, kiln_conv_opts *c)
{
	if (!o || o->kernel[0] <= 0 || o->kernel[1] <= 0) {
		ir_errorf_at(g, loc, KILN_EINVAL, "%s '%s': needs a positive 2-D kernel", kind, name);
		return false;
	}
	*c = *o;
	for (int i = 0; i < 2; i++) {
		c->stride[i] = o->stride[i] ? o->stride[i] : o->kernel[i];
		c->pad[2 + i] = o->pad[i];
	}
	return true;
}

static kiln_value maxpool2d(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                            const kiln_conv_opts *o)
{
	kiln_conv_opts c;
	if (!pool_opts(g, loc, "MaxPool2d", name, o, &c))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	return done(g, m, kiln_max_pool_at(g, loc, x, &c), name);
}

static kiln_value avgpool2d(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                            const kiln_conv_opts *o)
{
	kiln_conv_opts c;
	if (!pool_opts(g, loc, "AvgPool2d", name, o, &c))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	return done(g, m, kiln_avg_pool_at(g, loc, x, &c), name);
}

static kiln_value dropout(kiln_graph *g, kiln_loc loc, kiln_value x, double p)
{
	uint64_t seed = (uint64_t)(ir_rand_uniform(g) * 0x1p53);
	return kiln_dropout_at(g, loc, x, p, g->training, seed);
}

/* ---- Sequential ------------------------------------------------------------------ */

/* One Sequential entry: traces layer l named name on x. */
typedef kiln_value (*seq_fn)(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                             const kiln_layer *l);

static kiln_value seq_linear(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                             const kiln_layer *l)
{
	return kiln_linear_at(g, loc, name, x, l->n, !l->no_bias);
}

static kiln_value seq_conv1d(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                             const kiln_layer *l)
{
	return kiln_conv1d_at(g, loc, name, x, l->n, &l->conv, !l->no_bias);
}

static kiln_value seq_conv2d(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                             const kiln_layer *l)
{
	return kiln_conv2d_at(g, loc, name, x, l->n, &l->conv, !l->no_bias);
}

static kiln_value seq_batchnorm(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                const kiln_layer *l)
{
	return kiln_batchnorm_at(g, loc, name, x, 0, 0);
}

static kiln_value seq_layernorm(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                const kiln_layer *l)
{
	return kiln_layernorm_at(g, loc, name, x, 1, 0);
}

static kiln_value seq_dropout(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                              const kiln_layer *l)
{
	return dropout(g, loc, x, l->p);
}

static kiln_value seq_maxpool(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                              const kiln_layer *l)
{
	return maxpool2d(g, loc, name, x, &l->conv);
}

static kiln_value seq_avgpool(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                              const kiln_layer *l)
{
	return avgpool2d(g, loc, name, x, &l->conv);
}

static kiln_value seq_gap(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                          const kiln_layer *l)
{
	return kiln_global_avg_pool_at(g, loc, x);
}

static kiln_value seq_flatten(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                              const kiln_layer *l)
{
	return kiln_flatten_at(g, loc, x, 1);
}

static kiln_value seq_relu(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                           const kiln_layer *l)
{
	return kiln_relu_at(g, loc, x);
}

static kiln_value seq_gelu(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                           const kiln_layer *l)
{
	return kiln_gelu_at(g, loc, x, false);
}

static kiln_value seq_sigmoid(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                              const kiln_layer *l)
{
	return kiln_sigmoid_at(g, loc, x);
}

static kiln_value seq_tanh(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                           const kiln_layer *l)
{
	return kiln_tanh_at(g, loc, x);
}

static kiln_value seq_softmax(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                              const kiln_layer *l)
{
	return kiln_softmax_at(g, loc, x, 1);
}

static const seq_fn seq_table[] = {
	[KILN_L_LINEAR] = seq_linear,
	[KILN_L_CONV1D] = seq_conv1d,
	[KILN_L_CONV2D] = seq_conv2d,
	[KILN_L_BATCHNORM] = seq_batchnorm,
	[KILN_L_LAYERNORM] = seq_layernorm,
	[KILN_L_DROPOUT] = seq_dropout,
	[KILN_L_MAXPOOL2D] = seq_maxpool,
	[KILN_L_AVGPOOL2D] = seq_avgpool,
	[KILN_L_ADAPTIVEAVGPOOL2D_1] = seq_gap,
	[KILN_L_FLATTEN] = seq_flatten,
	[KILN_L_RELU] = seq_relu,
	[KILN_L_GELU] = seq_gelu,
	[KILN_L_SIGMOID] = seq_sigmoid,
	[KILN_L_TANH] = seq_tanh,
	[KILN_L_SOFTMAX] = seq_softmax,
};

/* Layer i is named "<name>.<i>", or "<i>" for an empty name (a top-level
 * nn.Sequential's state_dict has "0.weight"), counting every entry as
 * torch.nn.Sequential does, activations included. */
KILN_API kiln_value kiln_sequential_at(kiln_graph *g, kiln_loc loc, const char *name,
                                       kiln_value x, const kiln_layer *layers)
{
	if (!g || g->status != KILN_OK)
		return KILN_NONE;
	if (!layers) {
		ir_errorf_at(g, loc, KILN_EINVAL, "Sequential: null layer list");
		return KILN_NONE;
	}
	name = name ? name : "";
	ir_mark m = ir_mark_of(g);
	for (int i = 0; layers[i].kind != KILN_L_END && g->status == KILN_OK; i++) {
		unsigned kind = (unsigned)layers[i].kind;
		if (kind >= sizeof seq_table / sizeof *seq_table || !seq_table[kind]) {
			ir_errorf_at(g, loc, KILN_EINVAL, "Sequential '%s': layer %d has unknown kind %u",
			             name, i, kind);
			break;
		}
		char lname[512];
		snprintf(lname, sizeof lname, *name ? "%s.%d" : "%s%d", name, i);
		x = seq_table[kind](g, loc, lname, x, &layers[i]);
	}
	if (g->status != KILN_OK) {
		ir_rollback(g, m);
		return KILN_NONE;
	}
	return x;
}
