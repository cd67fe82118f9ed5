/*
 * plot.c: `kiln train --plot curve.svg`: the training curve as a
 * self-contained SVG (no fonts, scripts or other files), three panels on
 * one step axis: the loss of every step (thin) with its moving average
 * (thick), the validation accuracy at each evaluation, and the learning
 * rate.  A panel with no points (no --val data) is left out.
 *
 * Axes get "nice" ticks (1, 2 or 5 times a power of ten); non-finite
 * values (a loss gone NaN) are skipped, and the file is written atomically.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tools.h"

/* A tick step of 1, 2 or 5 x 10^k giving about n ticks over span. */
static double nice_step(double span, int n)
{
	if (!(span > 0) || !isfinite(span))
		return 1;
	double raw = span / n, p = pow(10, floor(log10(raw))), f = raw / p;
	return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void put_num(FILE *b, double v)
{
	if (v != 0 && (fabs(v) < 1e-3 || fabs(v) >= 1e5))
		fprintf(b, "%.0e", v);
	else
		fprintf(b, "%.4g", v);
}

typedef struct panel {
	const char *title;
	const double *x, *y; /* n points */
	int64_t n;
	const double *y2;    /* an overlay on the same x (the moving average), or NULL */
	const char *color;
	bool unit_range;     /* accuracy: the y axis spans [0, 1] at most */
} panel;

enum { W = 720, PH = 200, ML = 64, MR = 16, MT = 26, MB = 30 };

static void draw_panel(FILE *b, const panel *p, int top, double x0, double x1, bool xlabels)
{
	double y0 = INFINITY, y1 = -INFINITY;
	for (int64_t i = 0; i < p->n; i++)
		if (isfinite(p->y[i])) {
			y0 = fmin(y0, p->y[i]);
			y1 = fmax(y1, p->y[i]);
		}
	if (!isfinite(y0)) {
		y0 = 0;
		y1 = 1;
	}
	if (p->unit_range) {
		y0 = fmax(0, fmin(y0, 1));
		y1 = 1;
	}
	if (y1 - y0 < 1e-12 * fmax(1, fabs(y1))) { /* a flat line: give it room */
		double d = fabs(y1) > 0 ? fabs(y1) * 0.1 : 1;
		y0 -= d;
		y1 += d;
	}
	double ys = nice_step(y1 - y0, 4);
	y0 = floor(y0 / ys) * ys;
	y1 = ceil(y1 / ys) * ys;
	int pw = W - ML - MR, ph = PH - MT - MB, left = ML, base = top + MT + ph;
#define SX(v) (left + ((v) - x0) / (x1 - x0) * pw)
#define SY(v) (base - ((v) - y0) / (y1 - y0) * ph)
	fprintf(b, "<text x=\"%d\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", left,
	    top + 16, p->title);
	fprintf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
	       "stroke=\"#999\"/>\n", left, top + MT, pw, ph);
	for (double t = y0; t <= y1 + ys * 0.5; t += ys) {
		double yy = SY(t);
		fprintf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", left,
		    left + pw, yy, yy);
		fprintf(b, "<text x=\"%d\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">", left - 4,
		    yy + 3);
		put_num(b, fabs(t) < ys * 1e-9 ? 0 : t);
		fprintf(b, "</text>\n");
	}
	double xs = nice_step(x1 - x0, 6);
	for (double t = ceil(x0 / xs) * xs; t <= x1 + xs * 1e-9; t += xs) {
		double xx = SX(t);
		fprintf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#e5e5e5\"/>\n", xx, xx,
		    top + MT, base);
		if (xlabels) {
			fprintf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">", xx,
			    base + 13);
			put_num(b, t);
			fprintf(b, "</text>\n");
		}
	}
	for (int pass = 0; pass < (p->y2 ? 2 : 1); pass++) {
		const double *y = pass ? p->y2 : p->y;
		bool open = false;
		for (int64_t i = 0; i < p->n; i++) {
			if (!isfinite(y[i])) { /* a gap, not a line through it */
				if (open)
					fprintf(b, "\"/>\n");
				open = false;
				continue;
			}
			if (!open)
				fprintf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" "
				       "stroke-opacity=\"%s\" points=\"", p->color, pass || !p->y2 ? "1.8" : "0.8",
				    p->y2 && !pass ? "0.45" : "1");
			open = true;
			fprintf(b, "%.1f,%.1f ", SX(p->x[i]), SY(y[i]));
		}
		if (open)
			fprintf(b, "\"/>\n");
	}
	if (p->n == 1 || (p->n > 0 && p->n <= 20)) /* few points: mark them */
		for (int64_t i = 0; i < p->n; i++)
			if (isfinite(p->y[i]))
				fprintf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n",
				    SX(p->x[i]), SY(p->y[i]), p->color);
#undef SX
#undef SY
}

int plot_curve_svg(const char *path, const plot_curve *c)
{
	double x0 = INFINITY, x1 = -INFINITY;
	for (int64_t i = 0; i < c->n; i++) {
		x0 = fmin(x0, c->step[i]);
		x1 = fmax(x1, c->step[i]);
	}
	for (int64_t i = 0; i < c->nval; i++) {
		x0 = fmin(x0, c->val_step[i]);
		x1 = fmax(x1, c->val_step[i]);
	}
	if (!isfinite(x0))
		return tool_fail(1, "--plot '%s': no steps to draw", path);
	if (x1 <= x0)
		x1 = x0 + 1;
	/* moving average over about 2% of the run (at least 1 step) */
	double *avg = malloc(sizeof *avg * (size_t)(c->n + 1));
	if (!avg)
		return tool_fail(1, "out of memory");
	int64_t win = c->n / 50 > 1 ? c->n / 50 : 1;
	double sum = 0;
	int64_t cnt = 0;
	for (int64_t i = 0; i < c->n; i++) {
		if (isfinite(c->loss[i])) {
			sum += c->loss[i];
			cnt++;
		}
		if (i >= win && isfinite(c->loss[i - win])) {
			sum -= c->loss[i - win];
			cnt--;
		}
		avg[i] = cnt ? sum / (double)cnt : NAN;
	}
	panel p[3] = {
		{"training loss", c->step, c->loss, c->n, win > 1 ? avg : NULL, "#1f77b4", false},
		{"validation accuracy", c->val_step, c->val_acc, c->nval, NULL, "#2ca02c", true},
		{"learning rate", c->step, c->lr, c->n, NULL, "#d62728", false},
	};
	int np = 0, order[3];
	for (int i = 0; i < 3; i++)
		if (p[i].n > 0)
			order[np++] = i;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f) {
		free(avg);
		return tool_fail(1, "out of memory");
	}
	int h = np * PH + 24;
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
	        "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"Helvetica,Arial,"
	        "sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, h, W, h);
	for (int i = 0; i < np; i++)
		draw_panel(f, &p[order[i]], i * PH, x0, x1, true);
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">step</text>\n",
	    ML + (W - ML - MR) / 2, h - 6);
	fprintf(f, "</svg>\n");
	free(avg);
	if (ferror(f) | fclose(f)) {
		free(text);
		return tool_fail(1, "out of memory drawing --plot '%s'", path);
	}
	kiln_error e = {0};
	kiln_status st = kiln_write_file(path, text, len, &e);
	free(text);
	return st == KILN_OK ? 0 : tool_fail_err(NULL, &e, st);
}
