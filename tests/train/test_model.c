/*
 * test_model.c — the model of `bitexact train` (src/glm/train_model.h):
 *   grad   the loss against an fp64 re-implementation (model_ref.c) and
 *          the gradients of a sample of elements of every parameter
 *          against its central finite differences in fp64;
 *   layout one step's loss, per-token losses and gradients bit for bit
 *          over threads 1/2, micro-batches 1/2/4 and 1 vs 2 data-parallel
 *          ranks (threads of this process with an in-process all-reduce);
 *          the ordinary mode (negative control) shown to differ between
 *          micro-batch layouts;
 *   init   counter-based initialisation: the same bits on every create,
 *          element values recomputed in any order, transformers' init
 *          rules (normal(0, initializer_range), ones, zeros), names/order;
 *   time   a step of the tiny config, global batch 8 x seq 64, 1 thread.
 *
 *   build/tests/train/test_model [grad|layout|init|time ...]   (ctest: train_model)
 * Exit status 0 when every check passed; the last line "N passed, N failed".
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_ref.h"
#include "glm_node.h" /* GLM_GR_MARGIN */
#include "train_model.h"

static int npass, nfail;

static void check(int ok, const char *what) {
  if (ok) npass++;
  else nfail++;
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  fflush(stdout);
}

static uint64_t lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

static int32_t *make_tokens(int64_t nseq, int64_t L, int64_t V, uint64_t seed) {
  int32_t *t = malloc((size_t)(nseq * (L + 1)) * sizeof *t);
  for (int64_t i = 0; i < nseq * (L + 1); i++) t[i] = (int32_t)(lcg(&seed) % (uint64_t)V);
  return t;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A small config with every feature on: QK-norm, bias, 1 dense + 2 MoE
 * layers, groups, routed scaling, and a larger init so that the function
 * is far from linear. */
static void small_config(tr_config *c) {
  tr_config_tiny(c);
  c->vocab_size = 48;
  c->hidden_size = 24;
  c->intermediate_size = 40;
  c->moe_intermediate_size = 12;
  c->num_hidden_layers = 3;
  c->num_attention_heads = 4;
  c->num_key_value_heads = 2;
  c->head_dim = 8;
  c->use_qk_norm = 1;
  c->n_routed_experts = 8;
  c->num_experts_per_tok = 2;
  c->n_group = 2;
  c->topk_group = 1;
  c->routed_scaling_factor = 2.5;
  c->initializer_range = 0.2;
  c->rope_theta = 10000.0;
}

/* ---- grad: fp64 reference and finite differences ---------------------------- */

static void test_grad(void) {
  tr_config c;
  small_config(&c);
  tr_model *m;
  char err[512];
  if (tr_model_create(&c, 7, &m, err, sizeof err)) {
    check(0, err);
    return;
  }
  tr_param *p;
  size_t n = tr_model_params(m, &p);
  uint64_t rs = 99;
  for (size_t i = 0; i < n; i++) /* a non-zero e_score_correction_bias: it steers the choice only */
    if (p[i].group < 0)
      for (int64_t e = 0; e < p[i].numel; e++) p[i].data[e] = (float)((double)(lcg(&rs) % 1000) * 1e-4 - 0.05);
  int64_t L = 12, nseq = 3;
  int32_t *tok = make_tokens(nseq, L, c.vocab_size, 5);
  tr_run_opts o = {1, BX_TOKRED_GRID, L, 0, 0, NULL, NULL, NULL};
  float loss;
  float *tl = malloc((size_t)(nseq * L) * sizeof *tl);
  if (tr_model_grad(m, &o, tok, nseq, 0, nseq, 1, NULL, &loss, tl, err, sizeof err)) {
    check(0, err);
    goto out;
  }
  const char **names = malloc(n * sizeof *names);
  double **d = malloc(n * sizeof *d);
  for (size_t i = 0; i < n; i++) {
    names[i] = p[i].name;
    d[i] = malloc((size_t)p[i].numel * sizeof **d);
    for (int64_t e = 0; e < p[i].numel; e++) d[i][e] = p[i].data[e];
  }
  ref_model r = {c, n, names, d};
  double ref = ref_loss(&r, tok, nseq, L);
  double tsum = 0;
  for (int64_t i = 0; i < nseq * L; i++) tsum += tl[i];
  char msg[512];
  snprintf(msg, sizeof msg, "grad: loss %.9g vs fp64 reference %.9g (rel %.2e <= 1e-5); token losses' mean %.9g",
           loss, ref, fabs(loss - ref) / ref, tsum / (double)(nseq * L));
  check(fabs(loss - ref) <= 1e-5 * ref && fabs(tsum / (double)(nseq * L) - ref) <= 1e-5 * ref, msg);
  /* finite differences: 4 elements per parameter (the largest-gradient one
   * and 3 at random), h = 1e-4 and 2e-4; a pair that disagrees beyond
   * their truncation error marks a kink (a routing decision flipped) and is
   * skipped. Tolerance: |g - fd| <= 2e-3 |fd| + 1e-4 max|grad of the tensor|
   * (fp32 gradients of an fp32 forward: a few thousand roundings of 6e-8
   * along a path, cancellation in the residual sums). */
  int bad = 0, tested = 0, kinks = 0;
  double worst = 0;
  char wname[200] = "";
  for (size_t i = 0; i < n; i++) {
    if (!p[i].grad) continue;
    double gmax = 0;
    int64_t emax = 0;
    for (int64_t e = 0; e < p[i].numel; e++)
      if (fabs(p[i].grad[e]) > gmax) gmax = fabs(p[i].grad[e]), emax = e;
    for (int s = 0; s < 4; s++) {
      int64_t e = s == 0 ? emax : (int64_t)(lcg(&rs) % (uint64_t)p[i].numel);
      double fd[2], keep = d[i][e];
      for (int k = 0; k < 2; k++) {
        double h = 1e-4 * (k + 1);
        d[i][e] = keep + h;
        double lp = ref_loss(&r, tok, nseq, L);
        d[i][e] = keep - h;
        double lm = ref_loss(&r, tok, nseq, L);
        d[i][e] = keep;
        fd[k] = (lp - lm) / (2 * h);
      }
      if (fabs(fd[0] - fd[1]) > 1e-3 * fabs(fd[0]) + 1e-7) {
        kinks++;
        continue;
      }
      fd[0] = (4 * fd[0] - fd[1]) / 3; /* Richardson: the h^2 term cancels */
      double g = p[i].grad[e], tol = 2e-3 * fabs(fd[0]) + 1e-4 * gmax + 1e-9;
      tested++;
      double rel = fabs(g - fd[0]) / (fabs(fd[0]) + 1e-4 * gmax + 1e-12);
      if (rel > worst) {
        worst = rel;
        snprintf(wname, sizeof wname, "%s[%lld]: %.8g vs %.8g", p[i].name, (long long)e, g, fd[0]);
      }
      if (fabs(g - fd[0]) > tol) {
        if (bad++ < 10) printf("     %s[%lld]: grad %.8g, fd %.8g\n", p[i].name, (long long)e, g, fd[0]);
      }
    }
  }
  snprintf(msg, sizeof msg, "grad: %d elements of %zu tensors vs fp64 central differences (%d kinks "
           "skipped), worst relative error %.2e (%s), %d beyond tolerance", tested, n, kinks, worst,
           wname, bad);
  check(bad == 0 && tested > 0, msg);
  for (size_t i = 0; i < n; i++) free(d[i]);
  free(d);
  free(names);
out:
  free(tl);
  free(tok);
  tr_model_destroy(m);
}

/* ---- dump: the grad test's model, tokens, loss and gradients for
 * compare_transformers.py (index.txt: "name numel has_grad" lines; params.bin,
 * grads.bin: fp32 little-endian in that order; tokens.bin int32; loss.txt). */
static int dump(const char *dir) {
  tr_config c;
  small_config(&c);
  tr_model *m;
  char err[512], path[1024];
  if (tr_model_create(&c, 7, &m, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  tr_param *p;
  size_t n = tr_model_params(m, &p);
  uint64_t rs = 99;
  for (size_t i = 0; i < n; i++)
    if (p[i].group < 0)
      for (int64_t e = 0; e < p[i].numel; e++) p[i].data[e] = (float)((double)(lcg(&rs) % 1000) * 1e-4 - 0.05);
  int64_t L = 12, nseq = 3;
  int32_t *tok = make_tokens(nseq, L, c.vocab_size, 5);
  tr_run_opts o = {1, BX_TOKRED_GRID, L, 0, 0, NULL, NULL, NULL};
  float loss;
  if (tr_model_grad(m, &o, tok, nseq, 0, nseq, 1, NULL, &loss, NULL, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  snprintf(path, sizeof path, "%s/index.txt", dir);
  FILE *fi = fopen(path, "w");
  snprintf(path, sizeof path, "%s/params.bin", dir);
  FILE *fp = fopen(path, "wb");
  snprintf(path, sizeof path, "%s/grads.bin", dir);
  FILE *fg = fopen(path, "wb");
  snprintf(path, sizeof path, "%s/tokens.bin", dir);
  FILE *ft = fopen(path, "wb");
  snprintf(path, sizeof path, "%s/loss.txt", dir);
  FILE *fl = fopen(path, "w");
  if (!fi || !fp || !fg || !ft || !fl) {
    fprintf(stderr, "cannot write to %s\n", dir);
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    fprintf(fi, "%s %lld %d\n", p[i].name, (long long)p[i].numel, p[i].grad != NULL);
    fwrite(p[i].data, 4, (size_t)p[i].numel, fp);
    if (p[i].grad) fwrite(p[i].grad, 4, (size_t)p[i].numel, fg);
  }
  fwrite(tok, 4, (size_t)(nseq * (L + 1)), ft);
  fprintf(fl, "%.9g %lld %lld\n", loss, (long long)nseq, (long long)L);
  fclose(fi), fclose(fp), fclose(fg), fclose(ft), fclose(fl);
  free(tok);
  tr_model_destroy(m);
  return 0;
}

/* ---- layout invariance ---------------------------------------------------- */

typedef struct result {
  float loss;
  float *tl;       /* [nseq * L] */
  float **grads;   /* per parameter */
  size_t n;
} result;

static void result_free(result *r) {
  for (size_t i = 0; i < r->n; i++) free(r->grads[i]);
  free(r->grads);
  free(r->tl);
  memset(r, 0, sizeof *r);
}

static int result_take(result *r, tr_model *m, float loss, const float *tl, int64_t ntok) {
  tr_param *p;
  size_t n = tr_model_params(m, &p);
  r->loss = loss;
  r->tl = malloc((size_t)ntok * sizeof(float));
  memcpy(r->tl, tl, (size_t)ntok * sizeof(float));
  r->grads = calloc(n, sizeof *r->grads);
  r->n = n;
  for (size_t i = 0; i < n; i++) {
    if (!p[i].grad) continue;
    r->grads[i] = malloc((size_t)p[i].numel * sizeof(float));
    memcpy(r->grads[i], p[i].grad, (size_t)p[i].numel * sizeof(float));
  }
  return 0;
}

/* FNV-1a over the loss, the token losses and every gradient's bits (printed, so
 * that runs under BX_ISA=portable / avx2 / avx512 can be compared). */
static uint64_t result_hash(const result *r, tr_model *m, int64_t ntok) {
  tr_param *p;
  tr_model_params(m, &p);
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)&r->loss;
  for (int k = 0; k < 4; k++) h = (h ^ b[k]) * 1099511628211ull;
  b = (const unsigned char *)r->tl;
  for (int64_t k = 0; k < ntok * 4; k++) h = (h ^ b[k]) * 1099511628211ull;
  for (size_t i = 0; i < r->n; i++) {
    if (!r->grads[i]) continue;
    b = (const unsigned char *)r->grads[i];
    for (int64_t k = 0; k < p[i].numel * 4; k++) h = (h ^ b[k]) * 1099511628211ull;
  }
  return h;
}

static int result_same(const result *a, const result *b, tr_model *m, int64_t ntok) {
  tr_param *p;
  tr_model_params(m, &p);
  if (memcmp(&a->loss, &b->loss, 4) || memcmp(a->tl, b->tl, (size_t)ntok * 4)) return 0;
  for (size_t i = 0; i < a->n; i++)
    if (a->grads[i] && memcmp(a->grads[i], b->grads[i], (size_t)p[i].numel * 4)) return 0;
  return 1;
}

/* Two ranks as threads: an all-reduce over a shared buffer. */
typedef struct shared_comm {
  pthread_barrier_t bar;
  int64_t *buf[2];
  size_t n;
} shared_comm;

typedef struct rank_ctx {
  shared_comm *sc;
  int rank;
  tr_model *m;
  const tr_run_opts *o;
  const int32_t *tokens;
  int64_t local, first, global, mb;
  float loss, *tl;
  int rc;
  char err[512];
} rank_ctx;

static int thread_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  rank_ctx *rc = ctx;
  shared_comm *sc = rc->sc;
  sc->buf[rc->rank] = buf;
  sc->n = n;
  pthread_barrier_wait(&sc->bar);
  if (rc->rank == 0)
    for (size_t i = 0; i < n; i++) {
      int64_t a = sc->buf[0][i], b = sc->buf[1][i];
      sc->buf[0][i] = op == BX_OP_SUM ? a + b : (a > b ? a : b);
    }
  pthread_barrier_wait(&sc->bar);
  if (rc->rank == 1) memcpy(buf, sc->buf[0], n * sizeof *buf);
  pthread_barrier_wait(&sc->bar);
  return 0;
}

static void *rank_main(void *arg) {
  rank_ctx *r = arg;
  bx_comm comm = BX_COMM_DEFAULT;
  comm.allreduce_i64 = thread_allreduce;
  comm.ctx = r;
  comm.rank = r->rank;
  r->rc = tr_model_grad(r->m, r->o, r->tokens, r->local, r->first, r->global, r->mb, &comm, &r->loss,
                        r->tl, r->err, sizeof r->err);
  return NULL;
}

static void test_layout(void) {
  tr_config c;
  tr_config_tiny(&c);
  c.use_qk_norm = 1;
  int64_t L = 32, nseq = 8, ntok = nseq * L;
  int32_t *tok = make_tokens(nseq, L, c.vocab_size, 11);
  char err[512], msg[256];
  tr_model *m, *m2;
  if (tr_model_create(&c, 3, &m, err, sizeof err) || tr_model_create(&c, 3, &m2, err, sizeof err)) {
    check(0, err);
    free(tok);
    return;
  }
  float *tl = malloc((size_t)ntok * sizeof *tl), loss;
  result ref = {0}, cur = {0};
  int threads[] = {1, 2, 1, 2, 1}, mbs[] = {1, 1, 2, 4, 8};
  for (int k = 0; k < 5; k++) {
    tr_run_opts o = {threads[k], BX_TOKRED_GRID, L, 0, 0, NULL, NULL, NULL};
    if (tr_model_grad(m, &o, tok, nseq, 0, nseq, mbs[k], NULL, &loss, tl, err, sizeof err)) {
      check(0, err);
      break;
    }
    if (k == 0) {
      result_take(&ref, m, loss, tl, ntok);
      printf("     layout: loss %a, hash of loss, token losses and gradients %016llx (compare across BX_ISA)\n",
             (double)loss, (unsigned long long)result_hash(&ref, m, ntok));
      continue;
    }
    result_take(&cur, m, loss, tl, ntok);
    snprintf(msg, sizeof msg, "layout: threads %d, %d micro-batches: the bits of threads 1, 1 micro-batch",
             threads[k], mbs[k]);
    check(result_same(&ref, &cur, m, ntok), msg);
    result_free(&cur);
  }
  /* 2 data-parallel ranks (4 sequences each, 2 micro-batches), a thread each */
  shared_comm sc;
  pthread_barrier_init(&sc.bar, NULL, 2);
  tr_run_opts o2 = {1, BX_TOKRED_GRID, L, 0, 0, NULL, NULL, NULL};
  rank_ctx rk[2];
  pthread_t th[2];
  tr_model *ms[2] = {m, m2};
  for (int r = 0; r < 2; r++) {
    rk[r] = (rank_ctx){&sc, r, ms[r], &o2, tok + r * (nseq / 2) * (L + 1), nseq / 2, r * (nseq / 2), nseq, 2,
                       0, tl + r * (ntok / 2), 0, {0}};
    pthread_create(&th[r], NULL, rank_main, &rk[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&sc.bar);
  if (rk[0].rc || rk[1].rc) {
    check(0, rk[0].rc ? rk[0].err : rk[1].err);
  } else {
    result_take(&cur, m, rk[0].loss, tl, ntok);
    result cur2 = {0};
    result_take(&cur2, m2, rk[1].loss, tl, ntok);
    check(result_same(&ref, &cur, m, ntok) && result_same(&ref, &cur2, m2, ntok),
          "layout: 2 ranks x 2 micro-batches (in-process all-reduce): the same bits on both ranks");
    result_free(&cur);
    result_free(&cur2);
  }
  /* the ordinary mode: a framework's float sums per micro-batch, in layout order */
  result o1 = {0}, o4 = {0};
  tr_run_opts oo = {1, BX_TOKRED_ORDINARY, L, 0, 0, NULL, NULL, NULL};
  if (!tr_model_grad(m, &oo, tok, nseq, 0, nseq, 1, NULL, &loss, tl, err, sizeof err)) {
    result_take(&o1, m, loss, tl, ntok);
    if (!tr_model_grad(m, &oo, tok, nseq, 0, nseq, 4, NULL, &loss, tl, err, sizeof err)) {
      result_take(&o4, m, loss, tl, ntok);
      check(!result_same(&o1, &o4, m, ntok), "layout: ordinary mode (negative control): 1 vs 4 micro-batches differ");
      /* its one pass gives the bits of the two passes (pass 0 computes nothing it reads) */
      tr_run_opts otp = oo;
      otp.two_pass = 1;
      result t4 = {0};
      if (!tr_model_grad(m, &otp, tok, nseq, 0, nseq, 4, NULL, &loss, tl, err, sizeof err)) {
        result_take(&t4, m, loss, tl, ntok);
        check(result_same(&o4, &t4, m, ntok), "layout: ordinary mode: one pass = two passes, bit for bit");
        result_free(&t4);
      } else {
        check(0, err);
      }
      /* and it is still a gradient: close to the invariant one */
      tr_param *p;
      size_t n = tr_model_params(m, &p);
      double worst = 0;
      for (size_t i = 0; i < n; i++) {
        if (!p[i].grad) continue;
        double mx = 0, dmax = 0;
        for (int64_t e = 0; e < p[i].numel; e++) {
          mx = fmax(mx, fabs(ref.grads[i][e]));
          dmax = fmax(dmax, fabs((double)ref.grads[i][e] - o4.grads[i][e]));
        }
        if (mx > 0) worst = fmax(worst, dmax / mx);
      }
      snprintf(msg, sizeof msg, "layout: ordinary vs invariant gradients within 1e-4 of each tensor's max (%.2e)", worst);
      check(worst < 1e-4, msg);
    } else
      check(0, err);
  } else
    check(0, err);
  result_free(&o1);
  result_free(&o4);
  /* a layout that does not divide is refused with a reason */
  tr_run_opts o = {1, BX_TOKRED_GRID, L, 0, 0, NULL, NULL, NULL};
  check(tr_model_grad(m, &o, tok, nseq, 0, nseq, 3, NULL, &loss, tl, err, sizeof err) == -1 &&
            strstr(err, "micro-batches") != NULL,
        "layout: 8 sequences in 3 micro-batches refused");
  tok[5] = (int32_t)c.vocab_size;
  check(tr_model_grad(m, &o, tok, nseq, 0, nseq, 1, NULL, &loss, tl, err, sizeof err) == -1 &&
            strstr(err, "outside") != NULL,
        "layout: a token id outside the vocabulary refused");
  result_free(&ref);
  free(tl);
  free(tok);
  tr_model_destroy(m);
  tr_model_destroy(m2);
}


/* ---- the one-pass step ------------------------------------------------------ */

/* One gradient pass with the given history (NULL: none) and options; the
 * passes it ran in *passes. 0 / -1 (check failed with err). */
static int grad_with(tr_model *m, const int *hist, const tr_run_opts *o, const int32_t *tok,
                     int64_t nseq, int64_t mb, float *loss, float *tl, int *passes) {
  char err[512];
  size_t nh;
  tr_model_history(m, &nh);
  if (tr_model_set_history(m, hist, hist ? nh : 0, err, sizeof err) ||
      tr_model_grad(m, o, tok, nseq, 0, nseq, mb, NULL, loss, tl, err, sizeof err)) {
    check(0, err);
    return -1;
  }
  *passes = tr_model_last_passes(m);
  return 0;
}

/* The step on a grid stated from the history (one pass) gives the same
 * bits on every layout; a history too low for a tensor makes the step run
 * again on its observed grid, which is the forced fallback's (and the
 * no-history step's) bits exactly; the history is the observed exponents. */
static void test_one_pass(void) {
  tr_config c;
  tr_config_tiny(&c);
  int64_t L = 16, nseq = 8, ntok = nseq * L;
  int32_t *tok = make_tokens(nseq, L, c.vocab_size, 23);
  char err[512], msg[256];
  tr_model *m;
  if (tr_model_create(&c, 5, &m, err, sizeof err)) {
    check(0, err);
    free(tok);
    return;
  }
  float *tl = malloc((size_t)ntok * sizeof *tl), loss;
  size_t nh;
  check(tr_model_history(m, &nh) == NULL, "one pass: a new model has no history");
  int *hist = malloc(nh * sizeof *hist), *low = malloc(nh * sizeof *low);
  result obs = {0}, stated = {0}, cur = {0};
  tr_run_opts o = {1, BX_TOKRED_GRID, L, 0, 0, NULL, NULL, NULL};
  int passes = 0;
  /* no history: the first attempt only observes, the second adds on the observed grid */
  if (grad_with(m, NULL, &o, tok, nseq, 1, &loss, tl, &passes)) goto out;
  check(passes == 2, "one pass: without a history the step takes two passes");
  result_take(&obs, m, loss, tl, ntok);
  const int *h = tr_model_history(m, &nh);
  check(h != NULL, "one pass: a grid step leaves a history");
  if (!h) goto out;
  memcpy(hist, h, nh * sizeof *hist);
  int sane = 1;
  for (size_t i = 0; i < nh; i++) sane &= hist[i] >= -149 && hist[i] <= 128;
  check(sane && hist[nh - 1] > 0, "one pass: history exponents in range (the loss's positive)");
  /* with the history: one pass, the same bits on every layout */
  int threads[] = {1, 2, 1, 1}, mbs[] = {1, 1, 2, 8};
  for (int k = 0; k < 4; k++) {
    tr_run_opts ok = o;
    ok.threads = threads[k];
    if (grad_with(m, hist, &ok, tok, nseq, mbs[k], &loss, tl, &passes)) goto out;
    snprintf(msg, sizeof msg, "one pass: history, threads %d, %d micro-batches: one pass", threads[k], mbs[k]);
    check(passes == 1, msg);
    const int *h2 = tr_model_history(m, &nh);
    check(h2 && !memcmp(h2, hist, nh * sizeof *hist), "one pass: the observed history is the data's (unchanged)");
    if (k == 0) {
      result_take(&stated, m, loss, tl, ntok);
      continue;
    }
    result_take(&cur, m, loss, tl, ntok);
    snprintf(msg, sizeof msg, "one pass: threads %d, %d micro-batches: the bits of 1 thread, 1 micro-batch",
             threads[k], mbs[k]);
    check(result_same(&stated, &cur, m, ntok), msg);
    result_free(&cur);
  }
  /* a history too low: the stated grid breaks, the step runs again on the observed grid */
  for (int which = 0; which < 3; which++) {
    memcpy(low, hist, nh * sizeof *low);
    if (which == 0) low[0] -= GLM_GR_MARGIN + 1;      /* one tensor: its stated bound below */
    else if (which == 1) low[nh - 1] -= GLM_GR_MARGIN + 1; /* the loss */
    else for (size_t i = 0; i < nh; i++) low[i] = -149; /* every tensor */
    if (grad_with(m, low, &o, tok, nseq, which == 2 ? 4 : 2, &loss, tl, &passes)) goto out;
    result_take(&cur, m, loss, tl, ntok);
    snprintf(msg, sizeof msg, "one pass: history too low (%s): two passes, the observed grid's bits",
             which == 0 ? "tensor 0" : which == 1 ? "the loss" : "every tensor");
    check(passes == 2 && result_same(&obs, &cur, m, ntok), msg);
    result_free(&cur);
  }
  /* forced fallback (--grid-history off) despite a history: two passes, the observed grid */
  tr_run_opts of = o;
  of.two_pass = 1;
  for (int k = 0; k < 2; k++) {
    if (grad_with(m, hist, &of, tok, nseq, k ? 4 : 1, &loss, tl, &passes)) goto out;
    result_take(&cur, m, loss, tl, ntok);
    snprintf(msg, sizeof msg, "one pass: forced fallback, %d micro-batches: two passes, the observed grid's bits",
             k ? 4 : 1);
    check(passes == 2 && result_same(&obs, &cur, m, ntok), msg);
    result_free(&cur);
  }
  /* the history is checked */
  check(tr_model_set_history(m, hist, nh - 1, err, sizeof err) == -1 && strstr(err, "exponents"),
        "one pass: a history of the wrong length refused");
  low[3] = 129;
  check(tr_model_set_history(m, low, nh, err, sizeof err) == -1 && strstr(err, "outside"),
        "one pass: an exponent above 128 refused");
  /* the ordinary mode neither uses nor leaves a history */
  tr_model_set_history(m, NULL, 0, err, sizeof err);
  tr_run_opts oo = {1, BX_TOKRED_ORDINARY, L, 0, 0, NULL, NULL, NULL};
  if (grad_with(m, NULL, &oo, tok, nseq, 2, &loss, tl, &passes)) goto out;
  check(passes == 1 && tr_model_history(m, &nh) == NULL, "one pass: ordinary mode: one pass, no history");
out:
  result_free(&obs);
  result_free(&stated);
  result_free(&cur);
  free(hist);
  free(low);
  free(tl);
  free(tok);
  tr_model_destroy(m);
}

/* ---- init ------------------------------------------------------------------ */

static void test_init(void) {
  tr_config c;
  tr_config_tiny(&c);
  char err[512], msg[256];
  tr_model *a, *b, *x;
  if (tr_model_create(&c, 42, &a, err, sizeof err) || tr_model_create(&c, 42, &b, err, sizeof err) ||
      tr_model_create(&c, 43, &x, err, sizeof err)) {
    check(0, err);
    return;
  }
  tr_param *pa, *pb, *px;
  size_t na = tr_model_params(a, &pa), nb = tr_model_params(b, &pb);
  tr_model_params(x, &px);
  int same = na == nb, differ = 1, rules = 1;
  for (size_t i = 0; same && i < na; i++)
    same = !strcmp(pa[i].name, pb[i].name) && !memcmp(pa[i].data, pb[i].data, (size_t)pa[i].numel * 4);
  check(same, "init: two creates with one seed give the same names and bits");
  for (size_t i = 0; i < na; i++) {
    const char *nm = pa[i].name;
    size_t len = strlen(nm);
    int zero = pa[i].group < 0 || (len > 5 && !strcmp(nm + len - 5, ".bias"));
    int one = strstr(nm, "norm.weight") != NULL;
    for (int64_t e = 0; e < pa[i].numel; e++) {
      float want = zero ? 0.0f : one ? 1.0f : pa[i].data[e];
      if (memcmp(&want, &pa[i].data[e], 4)) rules = 0;
    }
    if (!zero && !one && !memcmp(pa[i].data, px[i].data, (size_t)pa[i].numel * 4)) differ = 0;
  }
  check(rules, "init: RMSNorm gains 1, biases and e_score_correction_bias 0");
  check(differ, "init: another seed changes every normal tensor");
  /* statistics of the largest tensor: normal(0, 0.02) */
  double s = 0, s2 = 0;
  int64_t n = pa[0].numel;
  for (int64_t e = 0; e < n; e++) s += pa[0].data[e], s2 += (double)pa[0].data[e] * pa[0].data[e];
  double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
  snprintf(msg, sizeof msg, "init: %s mean %.2e std %.5f (normal(0, 0.02): |mean| < 5 sd/sqrt(n), std within 2%%)",
           pa[0].name, mean, sd);
  check(fabs(mean) < 5 * 0.02 / sqrt((double)n) && fabs(sd - 0.02) < 0.0004, msg);
  /* names and order: transformers' named_parameters(), buffers after */
  int order = !strcmp(pa[0].name, "model.embed_tokens.weight") &&
              !strcmp(pa[1].name, "model.layers.0.self_attn.q_proj.weight") &&
              !strcmp(pa[2].name, "model.layers.0.self_attn.q_proj.bias");
  size_t last = 0;
  for (size_t i = 0; i < na; i++)
    if (pa[i].grad) last = i;
  order = order && !strcmp(pa[last].name, "lm_head.weight") && !strcmp(pa[last - 1].name, "model.norm.weight");
  for (size_t i = last + 1; i < na; i++)
    order = order && pa[i].group == -1 && !pa[i].grad && strstr(pa[i].name, "e_score_correction_bias");
  int found_expert = 0;
  for (size_t i = 0; i < na; i++)
    if (!strcmp(pa[i].name, "model.layers.1.mlp.experts.7.down_proj.weight"))
      found_expert = pa[i].group == TR_GROUP_EXPERT && pa[i].expert == 7 &&
                     pa[i].shape[0] == c.hidden_size && pa[i].shape[1] == c.moe_intermediate_size &&
                     !strcmp(pa[i + 1].name, "model.layers.1.mlp.gate.weight");
  check(order && found_expert, "init: transformers' names and order, hub expert names, buffers last");
  tr_model_destroy(a);
  tr_model_destroy(b);
  tr_model_destroy(x);
}

/* ---- time -------------------------------------------------------------------- */

static void test_time(void) {
  tr_config c;
  tr_config_tiny(&c);
  int64_t L = 64, nseq = 8;
  int32_t *tok = make_tokens(nseq, L, c.vocab_size, 17);
  char err[512], msg[256];
  tr_model *m;
  if (tr_model_create(&c, 1, &m, err, sizeof err)) {
    check(0, err);
    free(tok);
    return;
  }
  float loss, *tl = malloc((size_t)(nseq * L) * sizeof *tl);
  tr_run_opts o = {1, BX_TOKRED_GRID, L, 0, 0, NULL, NULL, NULL};
  double best = 1e9;
  int ok = 1;
  for (int r = 0; r < 3 && ok; r++) {
    double t0 = now();
    ok = !tr_model_grad(m, &o, tok, nseq, 0, nseq, 1, NULL, &loss, tl, err, sizeof err);
    best = fmin(best, now() - t0);
  }
  snprintf(msg, sizeof msg, "time: tiny config, 8 x 64 tokens, 1 thread: %.3f s per gradient pass (loss %.6f)",
           best, loss);
  check(ok && best < 5.0, ok ? msg : err);
  free(tl);
  free(tok);
  tr_model_destroy(m);
}

int main(int argc, char **argv) {
  struct { const char *name; void (*fn)(void); } tests[] = {
      {"init", test_init},         {"layout", test_layout}, {"one_pass", test_one_pass},
      {"grad", test_grad},         {"time", test_time}};
  if (argc == 3 && !strcmp(argv[1], "dump")) return dump(argv[2]);
  printf("# test_model: ISA %s\n", bx_isa_name());
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    int run = argc < 2;
    for (int a = 1; a < argc; a++) run |= !strcmp(argv[a], tests[i].name);
    if (run) tests[i].fn();
  }
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
