/*
 * grad.h: the shorthand the gradient rule files (grad.c, grad_nn.c) share,
 * private to them.
 *
 * Rules read as formulas: these expand to the IR's node builders
 * (ir/build.c) at the forward node's location, with g and n in scope.
 */
#ifndef KILN_PASSES_GRAD_H
#define KILN_PASSES_GRAD_H

#include "passes/passes.h"

#define L n->loc
#define ADD(a, b) kiln_add_at(g, L, a, b)
#define SUB(a, b) kiln_sub_at(g, L, a, b)
#define MUL(a, b) kiln_mul_at(g, L, a, b)
#define DIV(a, b) kiln_div_at(g, L, a, b)
#define NEG(a) kiln_neg_at(g, L, a)
#define K(v) kiln_scalar_at(g, L, pass_gtype(g, n->in[0])->dtype, v)
#define ZERO_WHERE(c, a) kiln_where_at(g, L, c, a, K(0)) /* c ? a : 0 */

#endif /* KILN_PASSES_GRAD_H */
