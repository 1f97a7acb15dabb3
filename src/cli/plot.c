/*
 * plot.c — `bitexact plot RECORD.jsonl... -o FILE.svg`: the curves of one
 * or several run records (records.h) as a plain SVG file, on shared axes:
 * a panel for the loss (with eval_loss dashed, as markers), one for the
 * learning rate, one for the gradient norm, each drawn when a record has
 * that key. With --drift REF.jsonl instead: per step, how many fp32 ULPs
 * each record's loss is from REF's at that step (0 is the bottom line),
 * on a log scale of 1 + ULPs: what `bitexact diff` reports, as a picture.
 * The file is written to a temporary name beside FILE and renamed into
 * place. Bad input: one line naming the file, exit 2, nothing written.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "records.h"

#define MAX_RUNS 16
#define WIDTH 960
#define PANEL_H 260
#define LEFT 90
#define RIGHT 340
#define TOP 40
#define BOTTOM 50

static const char *const palette[MAX_RUNS] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd"};

/* One curve: (step, value) points of one run. */
typedef struct curve {
  double *x, *y;
  size_t n;
} curve;

typedef struct panel {
  const char *title, *ylabel;
  int logy;          /* y drawn as log10(1 + y) (drift) */
  curve c[MAX_RUNS]; /* the solid curves */
  curve e[MAX_RUNS]; /* eval_loss (loss panel only): dashed with markers */
} panel;

static void curve_free(curve *c) {
  free(c->x);
  free(c->y);
  memset(c, 0, sizeof *c);
}

/* The values of key over rs (finite ones) into c. -1 out of memory. */
static int curve_of(const cli_records *rs, const char *key, curve *c) {
  c->x = malloc((rs->n + 1) * sizeof *c->x);
  c->y = malloc((rs->n + 1) * sizeof *c->y);
  c->n = 0;
  if (!c->x || !c->y) return -1;
  for (size_t i = 0; i < rs->n; i++) {
    double v;
    if (!cli_record_float(json_object_get(rs->r[i].obj, key), &v) || !isfinite(v)) continue;
    c->x[c->n] = (double)rs->r[i].step;
    c->y[c->n++] = v;
  }
  return 0;
}

/* fp32 ULP distance of two values that are fp32 (loss). */
static double ulp32(double a, double b) {
  float x = (float)a, y = (float)b;
  uint32_t u, v, m = 0x7fffffffu;
  memcpy(&u, &x, 4);
  memcpy(&v, &y, 4);
  uint64_t d = (u >> 31) == (v >> 31) ? ((u & m) > (v & m) ? (u & m) - (v & m) : (v & m) - (u & m))
                                      : (uint64_t)(u & m) + (v & m);
  return (double)d;
}

/* The drift of rs's loss from ref's at their common steps. */
static int drift_of(const cli_records *rs, const cli_records *ref, curve *c, double *worst) {
  c->x = malloc((rs->n + 1) * sizeof *c->x);
  c->y = malloc((rs->n + 1) * sizeof *c->y);
  c->n = 0;
  *worst = 0;
  if (!c->x || !c->y) return -1;
  size_t j = 0;
  for (size_t i = 0; i < rs->n; i++) {
    while (j < ref->n && ref->r[j].step < rs->r[i].step) j++;
    if (j == ref->n || ref->r[j].step != rs->r[i].step) continue;
    double a, b;
    if (!cli_record_float(json_object_get(rs->r[i].obj, "loss"), &a) ||
        !cli_record_float(json_object_get(ref->r[j].obj, "loss"), &b) || !isfinite(a) || !isfinite(b))
      continue;
    c->x[c->n] = (double)rs->r[i].step;
    c->y[c->n] = ulp32(a, b);
    if (c->y[c->n] > *worst) *worst = c->y[c->n];
    c->n++;
  }
  return 0;
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) for about n ticks. */
static double nice_step(double span, int n) {
  double raw = span / n, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
  }
}

typedef struct frame {
  double x0, x1, y0, y1; /* data range */
  double px, py, pw, ph; /* pixels */
  int logy;
} frame;

static double fx(const frame *f, double x) { return f->px + (x - f->x0) / (f->x1 - f->x0) * f->pw; }
static double fy(const frame *f, double y) {
  if (f->logy) y = log10(1 + y);
  return f->py + f->ph - (y - f->y0) / (f->y1 - f->y0) * f->ph;
}

static void draw_curve(FILE *out, const frame *fr, const curve *c, const char *color, int dashed) {
  if (c->n == 0) return;
  fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", color,
          dashed ? " stroke-dasharray=\"6 3\"" : "");
  for (size_t i = 0; i < c->n; i++) fprintf(out, "%s%.2f,%.2f", i ? " " : "", fx(fr, c->x[i]), fy(fr, c->y[i]));
  fputs("\"/>\n", out);
  if (dashed || c->n == 1)
    for (size_t i = 0; i < c->n; i++)
      fprintf(out, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n", fx(fr, c->x[i]),
              fy(fr, c->y[i]), color);
}

static void draw_panel(FILE *out, const panel *p, int nruns, double top, double xmin, double xmax) {
  frame fr = {xmin, xmax, INFINITY, -INFINITY, LEFT, top + TOP, WIDTH - LEFT - RIGHT,
              PANEL_H - TOP - BOTTOM, p->logy};
  for (int r = 0; r < nruns; r++)
    for (int k = 0; k < 2; k++) {
      const curve *c = k ? &p->e[r] : &p->c[r];
      for (size_t i = 0; i < c->n; i++) {
        double y = p->logy ? log10(1 + c->y[i]) : c->y[i];
        if (y < fr.y0) fr.y0 = y;
        if (y > fr.y1) fr.y1 = y;
      }
    }
  if (!(fr.y0 <= fr.y1)) fr.y0 = 0, fr.y1 = 1;
  if (p->logy) fr.y0 = 0;
  if (fr.y1 - fr.y0 < 1e-300 * (fabs(fr.y0) + 1e-300) || fr.y1 == fr.y0) {
    double d = fr.y0 == 0 ? 1 : fabs(fr.y0) * 0.01;
    fr.y0 -= p->logy ? 0 : d;
    fr.y1 += d;
  }
  double pad = 0.05 * (fr.y1 - fr.y0); /* curves clear of the frame */
  if (!p->logy) fr.y0 -= pad;
  fr.y1 += pad;
  if (fr.x1 <= fr.x0) fr.x1 = fr.x0 + 1;
  fprintf(out, "<g font-family=\"sans-serif\" font-size=\"12\">\n");
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">", fr.px, top + 22);
  escape(out, p->title);
  fputs("</text>\n", out);
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"white\" stroke=\"#333\"/>\n",
          fr.px, fr.py, fr.pw, fr.ph);
  /* y ticks */
  if (p->logy) { /* ticks at 0, 1, 10, 100, ... ULPs */
    for (int k = -1; k < 20; k++) {
      double v = k < 0 ? 0 : pow(10, k);
      if (log10(1 + v) > fr.y1) break;
      double y = fy(&fr, v);
      fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", fr.px,
              fr.px + fr.pw, y, y);
      fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", fr.px - 6, y + 4, v);
    }
  } else {
    double st = nice_step(fr.y1 - fr.y0, 5);
    for (double y = ceil(fr.y0 / st) * st; y <= fr.y1 + st * 1e-9; y += st) {
      double py = fy(&fr, y);
      fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", fr.px,
              fr.px + fr.pw, py, py);
      fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n", fr.px - 6, py + 4,
              fabs(y) < st * 1e-9 ? 0.0 : y);
    }
  }
  /* x ticks */
  double sx = nice_step(fr.x1 - fr.x0, 8);
  if (sx < 1) sx = 1;
  for (double x = ceil(fr.x0 / sx) * sx; x <= fr.x1 + 1e-9; x += sx) {
    double px = fx(&fr, x);
    fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px, px,
            fr.py, fr.py + fr.ph);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", px,
            fr.py + fr.ph + 16, x);
  }
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", fr.px + fr.pw / 2,
          fr.py + fr.ph + 34);
  fprintf(out, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">", 18.0,
          fr.py + fr.ph / 2);
  escape(out, p->ylabel);
  fputs("</text>\n", out);
  for (int r = 0; r < nruns; r++) {
    draw_curve(out, &fr, &p->c[r], palette[r], 0);
    draw_curve(out, &fr, &p->e[r], palette[r], 1);
  }
  fputs("</g>\n", out);
}

static void draw_legend(FILE *out, const char *const *labels, const char *const *notes, int nruns) {
  fputs("<g font-family=\"sans-serif\" font-size=\"12\">\n", out);
  for (int r = 0; r < nruns; r++) {
    double y = TOP + 10 + 18.0 * r, x = WIDTH - RIGHT + 16;
    fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n",
            x, x + 22, y, y, palette[r]);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">", x + 28, y + 4);
    escape(out, labels[r]);
    if (notes && notes[r]) {
      fputc(' ', out);
      escape(out, notes[r]);
    }
    fputs("</text>\n", out);
  }
  fputs("</g>\n", out);
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

int cmd_plot(int argc, char **argv) {
  const char *outp = NULL, *drift = NULL, *title = NULL;
  const char *files[MAX_RUNS], *labels[MAX_RUNS];
  int nfiles = 0, nlabels = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int valued = !strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--drift") ||
                 !strcmp(a, "--label") || !strcmp(a, "--title");
    if (valued && i + 1 >= argc) return cli_error("plot: %s needs a value", a), CLI_ERROR;
    if (!strcmp(a, "-o") || !strcmp(a, "--output")) outp = argv[++i];
    else if (!strcmp(a, "--drift")) drift = argv[++i];
    else if (!strcmp(a, "--title")) title = argv[++i];
    else if (!strcmp(a, "--label")) {
      if (nlabels == MAX_RUNS) return cli_error("plot: more than %d --label", MAX_RUNS), CLI_ERROR;
      labels[nlabels++] = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      return cli_error("plot: unknown argument '%s' (usage: bitexact plot [--drift REF.jsonl] "
                       "[--label NAME]... [--title TEXT] -o FILE.svg RECORD.jsonl...)", a), CLI_ERROR;
    } else {
      if (nfiles == MAX_RUNS) return cli_error("plot: more than %d records", MAX_RUNS), CLI_ERROR;
      files[nfiles++] = a;
    }
  }
  if (!outp) return cli_error("plot: -o FILE.svg is required"), CLI_ERROR;
  if (nfiles == 0) return cli_error("plot: no RECORD.jsonl given"), CLI_ERROR;
  if (nlabels && nlabels != nfiles)
    return cli_error("plot: %d --label for %d records (one each, or none)", nlabels, nfiles), CLI_ERROR;
  for (int i = nlabels; i < nfiles; i++) labels[i] = base_name(files[i]);
  cli_records rs[MAX_RUNS], ref;
  memset(rs, 0, sizeof rs);
  memset(&ref, 0, sizeof ref);
  int rc = CLI_ERROR, np = 0;
  panel *pn = calloc(3, sizeof *pn);
  char notes_buf[MAX_RUNS][48];
  const char *notes[MAX_RUNS] = {0};
  char tmp[4200] = "";
  FILE *out = NULL;
  if (!pn) {
    cli_error("plot: out of memory");
    goto done;
  }
  for (int i = 0; i < nfiles; i++)
    if (cli_records_load(files[i], &rs[i])) goto done;
  if (drift && cli_records_load(drift, &ref)) goto done;
  double xmin = INFINITY, xmax = -INFINITY;
  for (int i = 0; i < nfiles; i++) {
    if ((double)rs[i].r[0].step < xmin) xmin = (double)rs[i].r[0].step;
    if ((double)rs[i].r[rs[i].n - 1].step > xmax) xmax = (double)rs[i].r[rs[i].n - 1].step;
  }
  if (drift) {
    pn[0].title = title ? title : "loss distance from the reference, per step";
    pn[0].ylabel = "fp32 ULPs of the loss (log scale)";
    pn[0].logy = 1;
    for (int i = 0; i < nfiles; i++) {
      double worst;
      if (drift_of(&rs[i], &ref, &pn[0].c[i], &worst)) goto oom;
      if (pn[0].c[i].n == 0) {
        cli_error("plot: %s: no step in common with --drift %s (with a loss)", files[i], drift);
        goto done;
      }
      snprintf(notes_buf[i], sizeof notes_buf[i], "(max %.0f ULP)", worst);
      notes[i] = notes_buf[i];
    }
    np = 1;
  } else {
    static const char *const keys[3] = {"loss", "lr", "grad_norm"};
    static const char *const ylab[3] = {"loss (dashed: eval_loss)", "learning rate", "gradient norm"};
    for (int k = 0; k < 3; k++) {
      panel *p = &pn[np];
      size_t pts = 0;
      for (int i = 0; i < nfiles; i++) {
        if (curve_of(&rs[i], keys[k], &p->c[i])) goto oom;
        if (k == 0 && curve_of(&rs[i], "eval_loss", &p->e[i])) goto oom;
        pts += p->c[i].n + p->e[i].n;
      }
      if (!pts) {
        for (int i = 0; i < nfiles; i++) curve_free(&p->c[i]), curve_free(&p->e[i]);
        continue;
      }
      p->title = k == 0 && title ? title : keys[k];
      p->ylabel = ylab[k];
      np++;
    }
    if (np == 0) {
      cli_error("plot: %s: no loss, lr or grad_norm values to draw", files[0]);
      goto done;
    }
  }
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", outp, (int)getpid());
  out = fopen(tmp, "w");
  if (!out) {
    cli_error("plot: -o %s: cannot create: %s", outp, strerror(errno));
    goto done;
  }
  int height = PANEL_H * np + 10, legend = TOP + 18 * nfiles + 20;
  if (height < legend) height = legend;
  fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          WIDTH, height, WIDTH, height);
  for (int k = 0; k < np; k++) draw_panel(out, &pn[k], nfiles, (double)k * PANEL_H, xmin, xmax);
  draw_legend(out, labels, notes, nfiles);
  fputs("</svg>\n", out);
  int bad = ferror(out) != 0;
  bad |= fclose(out) != 0;
  out = NULL;
  if (bad || rename(tmp, outp) != 0) {
    cli_error("plot: -o %s: cannot write: %s", outp, strerror(errno));
    unlink(tmp);
    goto done;
  }
  tmp[0] = 0;
  fprintf(cli_out(), "plot: %s (%d panel%s, %d run%s)\n", outp, np, np > 1 ? "s" : "", nfiles,
          nfiles > 1 ? "s" : "");
  rc = CLI_OK;
  goto done;
oom:
  cli_error("plot: out of memory");
done:
  if (out) fclose(out);
  if (tmp[0]) unlink(tmp);
  for (int k = 0; pn && k < 3; k++)
    for (int i = 0; i < MAX_RUNS; i++) curve_free(&pn[k].c[i]), curve_free(&pn[k].e[i]);
  free(pn);
  for (int i = 0; i < nfiles; i++) cli_records_free(&rs[i]);
  if (drift) cli_records_free(&ref);
  return rc;
}
