/*
 * conv_geom.c: the spatial geometry of a convolution, its transpose or a
 * pooling window, from the node's attributes and the sizes of its input,
 * output and kernel: one rule that the reference interpreter
 * (ir/interp_nn.c) and the lowering (codegen/lower_nn.c) share, so the
 * two cannot disagree about strides, dilations or padding.  The padding
 * itself is ir_conv_pad's (ir/shape_nn.c), which shape inference uses too.
 */
#include <string.h>

#include "ir/ir.h"

/* An ints attribute with one entry per spatial dim, or dflt everywhere;
 * false when it has neither that many entries nor none. */
static bool spatial_attr(const ir_node *n, const char *name, int64_t dflt, int64_t *v, int want)
{
	const int64_t *a;
	uint32_t na = ir_attr_ints(n, name, &a);
	for (int d = 0; d < want; d++)
		v[d] = na ? a[d < (int)na ? d : 0] : dflt;
	return na == 0 || na == (uint32_t)want;
}

ir_geom_status ir_conv_geom_of(const ir_node *n, int xrank, const int64_t *x, int yrank,
                               const int64_t *y, const int64_t *k, bool transpose,
                               ir_conv_geom *g)
{
	g->nsp = xrank - 2;
	if (g->nsp < 1 || g->nsp > 3 || yrank != xrank)
		return IR_GEOM_RANK;
	int64_t pads[6], opad[3];
	const int64_t *oshape;
	bool ok = spatial_attr(n, "strides", 1, g->stride, g->nsp) &&
	          spatial_attr(n, "dilations", 1, g->dil, g->nsp) &&
	          spatial_attr(n, "pads", 0, pads, 2 * g->nsp) &&
	          spatial_attr(n, "output_padding", 0, opad, g->nsp);
	const char *ap = ir_attr_str(n, "auto_pad", "NOTSET");
	bool same = !strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER");
	bool derive = same || (transpose && ir_attr_ints(n, "output_shape", &oshape));
	if (!ok)
		return IR_GEOM_ATTR;
	g->isz = g->osz = g->ksz = 1;
	for (int d = 0; d < g->nsp; d++) {
		g->in[d] = x[2 + d], g->out[d] = y[2 + d], g->k[d] = k[d];
		if (g->in[d] < 0 || g->out[d] < 0 || g->k[d] < 1 || g->stride[d] < 1 || g->dil[d] < 1)
			return IR_GEOM_DIM;
		int64_t span = (g->k[d] - 1) * g->dil[d] + 1;
		ir_conv_pad(ap, derive, transpose, g->in[d], g->out[d], span, g->stride[d], opad[d],
		            pads[d], pads[g->nsp + d], &g->pad[d], &g->pad_end[d]);
		g->isz *= g->in[d], g->osz *= g->out[d], g->ksz *= g->k[d];
	}
	return IR_GEOM_OK;
}
