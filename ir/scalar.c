/*
 * scalar.c: the one place an elementwise op's arithmetic is written.
 *
 * An op listed in ir_scalar_table is a composite of primitives: its rule
 * builds a small expression (ir_sexpr, an SSA list over the input x and
 * constants) from the node's attributes, and every stage reads that one
 * expression.  The interpreter evaluates it in double (ir_scalar_eval), the
 * lowering emits it as kernel-IR scalar expressions (codegen/lower.c), the
 * gradient is its symbolic derivative (ir_scalar_deriv) emitted as graph
 * nodes (passes/grad.c), and ONNX export writes it as nodes where opset 17
 * lacks the op (Gelu).  Shape inference and the .kir, ONNX and DSL names
 * come from the op's ops.def row, so an elementwise op such as Softplus is
 * its row, its rule below and its DSL name in kiln.h.  Fusion in the
 * lowering turns the expression back into one loop, so a composite costs no
 * more than a hand-written kernel.
 *
 * Primitives keep the lowering's semantics: MAX and MIN propagate NaN,
 * LT gives a condition that only SELECT reads.
 */
#include <math.h>
#include <string.h>

#include "ir/ir.h"

/* ---- building ------------------------------------------------------------ */

/* Appends one instruction (operands not used are -1); a failed operand (-1
 * where one is needed) fails it too, and a full list sets e->full. */
int ir_sx(ir_sexpr *e, ir_sop op, int a, int b, int c, double k)
{
	int need = op <= IR_S_K ? 0 : op < IR_S_ADD ? 1 : op < IR_S_SELECT ? 2 : 3;
	if ((need > 0 && a < 0) || (need > 1 && b < 0) || (need > 2 && c < 0))
		return -1;
	if (e->n >= IR_SEXPR_MAX) {
		e->full = true;
		return -1;
	}
	e->i[e->n] = (ir_sinst){op, a, b, c, k};
	return e->n++;
}

/* Rules read as formulas: e is in scope. */
#define X() ir_sx(e, IR_S_X, -1, -1, -1, 0)
#define K(v) ir_sx(e, IR_S_K, -1, -1, -1, v)
#define U(op, a) ir_sx(e, IR_S_##op, a, -1, -1, 0)
#define B(op, a, b) ir_sx(e, IR_S_##op, a, b, -1, 0)
#define ADD(a, b) B(ADD, a, b)
#define SUB(a, b) B(SUB, a, b)
#define MUL(a, b) B(MUL, a, b)
#define DIV(a, b) B(DIV, a, b)
#define SELECT(c, a, b) ir_sx(e, IR_S_SELECT, c, a, b, 0)

/* ---- the rules ------------------------------------------------------------ */

/* 0.5 x (1 + erf(x / sqrt 2)), or with approximate="tanh"
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static int gelu(ir_sexpr *e, const ir_node *n, int x)
{
	int inner;
	const char *ap = ir_attr_str(n, "approximate", "none");
	if (!strcmp(ap, "tanh")) {
		int x3 = MUL(MUL(x, x), x);
		int u = ADD(x, MUL(K(0.044715), x3));
		inner = U(TANH, MUL(K(sqrt(2 / M_PI)), u));
	} else if (!strcmp(ap, "none")) {
		inner = U(ERF, MUL(x, K(M_SQRT1_2)));
	} else {
		return -1;
	}
	return MUL(MUL(K(0.5), x), ADD(K(1), inner));
}

/* x > 0 ? x : alpha x; the gradient at 0 is alpha's, as PyTorch's */
static int leaky_relu(ir_sexpr *e, const ir_node *n, int x)
{
	return SELECT(B(LT, K(0), x), x, MUL(x, K(ir_attr_float(n, "alpha", 0.01))));
}

/* log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): no overflow. */
static int softplus(ir_sexpr *e, const ir_node *n, int x)
{
	return ADD(B(MAX, x, K(0)), U(LOG, ADD(K(1), U(EXP, U(NEG, U(ABS, x))))));
}

/* max(0, min(1, alpha x + beta)) */
static int hard_sigmoid(ir_sexpr *e, const ir_node *n, int x)
{
	double alpha = ir_attr_float(n, "alpha", 0.2), beta = ir_attr_float(n, "beta", 0.5);
	return B(MAX, K(0), B(MIN, ADD(MUL(K(alpha), x), K(beta)), K(1)));
}

/* x max(0, min(1, x/6 + 1/2)) */
static int hard_swish(ir_sexpr *e, const ir_node *n, int x)
{
	return MUL(x, B(MAX, K(0), B(MIN, ADD(MUL(K(1.0 / 6), x), K(0.5)), K(1))));
}

/* x tanh(softplus(x)); ONNX has it from opset 18 */
static int mish(ir_sexpr *e, const ir_node *n, int x)
{
	return MUL(x, U(TANH, softplus(e, n, x)));
}

/* x / (1 + |x|) */
static int softsign(ir_sexpr *e, const ir_node *n, int x)
{
	return DIV(x, ADD(K(1), U(ABS, x)));
}

/* x > 0 ? x : a (exp(x) - 1), the negative side scaled by alpha */
static int elu_with(ir_sexpr *e, int x, double a)
{
	return SELECT(B(LT, K(0), x), x, MUL(K(a), SUB(U(EXP, x), K(1))));
}

static int elu(ir_sexpr *e, const ir_node *n, int x)
{
	return elu_with(e, x, ir_attr_float(n, "alpha", 1));
}

/* gamma elu(x, alpha), with SELU's constants as defaults */
static int selu(ir_sexpr *e, const ir_node *n, int x)
{
	double alpha = ir_attr_float(n, "alpha", 1.67326319217681884765625);
	return MUL(K(ir_attr_float(n, "gamma", 1.05070102214813232421875)), elu_with(e, x, alpha));
}

/* max(0, x) + min(0, alpha (exp(x / alpha) - 1)) */
static int celu(ir_sexpr *e, const ir_node *n, int x)
{
	double alpha = ir_attr_float(n, "alpha", 1);
	int neg = MUL(K(alpha), SUB(U(EXP, DIV(x, K(alpha))), K(1)));
	return ADD(B(MAX, K(0), x), B(MIN, K(0), neg));
}

/* x > alpha ? x : 0 */
static int thresholded_relu(ir_sexpr *e, const ir_node *n, int x)
{
	return SELECT(B(LT, K(ir_attr_float(n, "alpha", 1)), x), x, K(0));
}

const ir_scalar_rule ir_scalar_table[KILN_OP_COUNT] = {
	[KILN_OP_LEAKY_RELU] = leaky_relu,
	[KILN_OP_GELU] = gelu,
	[KILN_OP_SOFTPLUS] = softplus,
	[KILN_OP_HARD_SIGMOID] = hard_sigmoid,
	[KILN_OP_HARD_SWISH] = hard_swish,
	[KILN_OP_MISH] = mish,
	[KILN_OP_SOFTSIGN] = softsign,
	[KILN_OP_ELU] = elu,
	[KILN_OP_SELU] = selu,
	[KILN_OP_CELU] = celu,
	[KILN_OP_THRESHOLDED_RELU] = thresholded_relu,
};

kiln_status ir_scalar_build(const ir_node *n, ir_sexpr *e)
{
	e->n = 0, e->full = false;
	if (n->op >= KILN_OP_COUNT || !ir_scalar_table[n->op])
		return KILN_EUNSUPPORTED;
	e->root = ir_scalar_table[n->op](e, n, X());
	if (e->full)
		return KILN_ENOMEM;
	return e->root < 0 ? KILN_EINVAL : KILN_OK;
}

/* ---- evaluation --------------------------------------------------------- */

double ir_scalar_eval(const ir_sexpr *e, double x)
{
	double v[IR_SEXPR_MAX];
	for (int i = 0; i < e->n; i++) {
		const ir_sinst *s = &e->i[i];
		double a = s->a >= 0 ? v[s->a] : 0, b = s->b >= 0 ? v[s->b] : 0;
		double c = s->c >= 0 ? v[s->c] : 0;
		switch (s->op) {
		case IR_S_X: v[i] = x; break;
		case IR_S_K: v[i] = s->k; break;
		case IR_S_NEG: v[i] = -a; break;
		case IR_S_ABS: v[i] = fabs(a); break;
		case IR_S_EXP: v[i] = exp(a); break;
		case IR_S_LOG: v[i] = log(a); break;
		case IR_S_SQRT: v[i] = sqrt(a); break;
		case IR_S_TANH: v[i] = tanh(a); break;
		case IR_S_ERF: v[i] = erf(a); break;
		case IR_S_ADD: v[i] = a + b; break;
		case IR_S_SUB: v[i] = a - b; break;
		case IR_S_MUL: v[i] = a * b; break;
		case IR_S_DIV: v[i] = a / b; break;
		case IR_S_MAX: v[i] = isnan(a) || isnan(b) ? NAN : a > b ? a : b; break;
		case IR_S_MIN: v[i] = isnan(a) || isnan(b) ? NAN : a < b ? a : b; break;
		case IR_S_LT: v[i] = a < b; break;
		case IR_S_SELECT: v[i] = a != 0 ? b : c; break;
		}
	}
	return e->n ? v[e->root] : x;
}

/* ---- the derivative ------------------------------------------------------- */

enum { ZERO = -2, ONE = -3 }; /* derivative markers: no instruction needed */

static int dmul(ir_sexpr *e, int d, int v)
{
	return d == ZERO ? ZERO : d == ONE ? v : MUL(d, v);
}

static int dval(ir_sexpr *e, int d)
{
	return d == ZERO ? K(0) : d == ONE ? K(1) : d;
}

static int dadd(ir_sexpr *e, int a, int b, bool sub)
{
	if (b == ZERO)
		return a;
	if (a == ZERO)
		return sub ? U(NEG, dval(e, b)) : b;
	return sub ? SUB(dval(e, a), dval(e, b)) : ADD(dval(e, a), dval(e, b));
}

static int dselect(ir_sexpr *e, int c, int a, int b)
{
	return a == ZERO && b == ZERO ? ZERO : SELECT(c, dval(e, a), dval(e, b));
}

/* The derivative of instruction i, given those of its operands in d[]. */
static int dinst(ir_sexpr *e, int i, const int *d)
{
	ir_sinst s = e->i[i];
	int a = s.a, b = s.b, da = a >= 0 ? d[a] : ZERO, db = b >= 0 ? d[b] : ZERO;
	switch (s.op) {
	case IR_S_X: return ONE;
	case IR_S_K: case IR_S_LT: return ZERO;
	case IR_S_NEG: return da == ZERO ? ZERO : U(NEG, dval(e, da));
	case IR_S_ABS: return dmul(e, da, SELECT(B(LT, a, K(0)), K(-1), K(1)));
	case IR_S_EXP: return dmul(e, da, i);
	case IR_S_LOG: return da == ZERO ? ZERO : DIV(dval(e, da), a);
	case IR_S_SQRT: return da == ZERO ? ZERO : DIV(dval(e, da), MUL(K(2), i));
	case IR_S_TANH: return dmul(e, da, SUB(K(1), MUL(i, i)));
	case IR_S_ERF: return dmul(e, da, MUL(K(2 / sqrt(M_PI)), U(EXP, U(NEG, MUL(a, a)))));
	case IR_S_ADD: return dadd(e, da, db, false);
	case IR_S_SUB: return dadd(e, da, db, true);
	case IR_S_MUL: return dadd(e, dmul(e, da, b), dmul(e, db, a), false);
	case IR_S_DIV: /* (da - y db) / b */
		return da == ZERO && db == ZERO ? ZERO : DIV(dval(e, dadd(e, da, dmul(e, db, i), true)), b);
	case IR_S_MAX: return dselect(e, B(LT, a, b), db, da);
	case IR_S_MIN: return dselect(e, B(LT, a, b), da, db);
	case IR_S_SELECT: return dselect(e, a, db, d[s.c]);
	}
	return ZERO;
}

kiln_status ir_scalar_deriv(const ir_node *n, ir_sexpr *e)
{
	kiln_status st = ir_scalar_build(n, e);
	if (st)
		return st;
	int fwd = e->n, d[IR_SEXPR_MAX];
	for (int i = 0; i < IR_SEXPR_MAX; i++)
		d[i] = ZERO;
	for (int i = 0; i < fwd && !e->full; i++)
		d[i] = dinst(e, i, d);
	if (e->full)
		return KILN_ENOMEM;
	e->root = dval(e, d[e->root]);
	return e->full ? KILN_ENOMEM : KILN_OK;
}
