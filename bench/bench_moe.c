/*
 * bench_moe.c — forward + backward of the model module's GLM-4.5 MoE block
 * (tr_moe_forward / tr_moe_backward of src/glm/train_moe_block.c: the
 * block `bitexact train` runs), next to the same layer in torch eager
 * (bench/bench_moe_torch.py, --torch) in the same run.
 *
 * The model: the built-in tiny config (tr_config_tiny) cut to one decoder
 * layer whose MLP is the MoE block (first_k_dense_replace 0), with the
 * bench's shapes: hidden 256, 8 routed experts top-2 in 2 groups (1 kept),
 * expert intermediate 128, 1 shared expert, routed scaling 2.5 (as the
 * torch script); parameters from tr_model_create's seeded init (weights
 * normal(0, 0.02), e_score_correction_bias 0). Only the MoE block runs:
 * its input (the layer's act.xn2, the post-attention norm's output) and
 * the gradient of its output are normal(0, 1) from tr_init_normal with
 * fixed seeds, T tokens (--tokens, default 1024).
 *
 * A step is what tr_model_grad (src/glm/train_step.c) does for this layer
 * of one micro-batch of T tokens: a bx_tokred state over the block's
 * weight gradients, pass 0 (tr_moe_forward, tr_moe_backward: the weight
 * gradients' a-priori bounds, no TN GEMM), bx_tokred_agree, pass 1 (the
 * forward and backward again, every chunk partial added), bx_tokred_finish
 * into the parameters' grads. In two modes of the token reduction:
 *   grid      BX_TOKRED_GRID, chunks of --chunk tokens (default 256, a
 *             "sequence"): the layout-invariant gradients;
 *   ordinary  BX_TOKRED_ORDINARY, one chunk of all T tokens (the model's
 *             ordinary mode: a micro-batch is a chunk, fp32 sums): the
 *             in-run baseline.
 * "pass 1" columns: the time of pass 1 + finish alone (one forward +
 * backward with the gradients added), the part comparable to torch's one
 * forward + backward. The state's tensor i is parameter i (the block adds
 * to its parameters' indices); the parameters below the block's last
 * that the block does not own (embedding, attention) are one-element
 * stand-ins given a zero partial per chunk, so that finish's coverage
 * check passes at no cost.
 *
 * What the earlier bench_moe did and this one does not: its own copy of
 * the layer from bitexact_train.h's kernels (fused gate_up experts, one
 * forward per step) and its "plain" mode (one fixed-order TN GEMM per
 * weight, no token reduction); the model's block has separate gate and up
 * projections, runs the forward and backward in both passes, and always
 * goes through the token reduction, so the baseline is its ordinary mode.
 *
 * A time is the median of --reps steps after one warm-up step per mode;
 * with --torch each rep also runs the torch script (its own median of 3
 * steps), so both see the same machine load; the ratios printed are
 * medians over reps of the per-rep ratios.
 *
 *   bench_moe [--torch] [--torch-script PATH] [--threads 1,2] [--reps R]
 *             [--tokens T] [--chunk C]
 *
 * It checks that every thread count gives the output, dxn2 and weight
 * gradient bits of the first, in each mode (exit status 1 if not).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "glm_config.h"
#include "train_model_internal.h"

/* The bench's shapes (the torch script's arguments too). */
enum { HIDDEN = 256, EXPERTS = 8, TOPK = 2, GROUPS = 2, KEPT_GROUPS = 1, EXPERT_INTER = 128,
       SHARED = 1 };
#define ROUTED_SCALING 2.5 /* bench_moe_torch.py's factor */
#define MAX_THREAD_COUNTS 8
#define MAX_REPS 99

static void fail(const char *what, const char *detail) {
  fprintf(stderr, "bench_moe: %s: %s\n", what, detail);
  exit(2);
}

/* One micro-batch's workspace of the block in one token-reduction mode. */
typedef struct mode_run {
  bx_tokred_mode mode;
  const char *name;
  tr_work *w;          /* C = --chunk (grid) or T (ordinary) */
} mode_run;

/* The model and what a step needs around it. */
typedef struct bench {
  tr_model *m;
  int64_t layer;       /* 0: the one MoE layer */
  int64_t T;
  int threads;
  size_t ntensors;     /* the state's tensors: parameters [0, ntensors) */
  char *in_block;      /* [ntensors] 1: a parameter of the block, 0: a stand-in */
  DLTensor *grads;     /* [ntensors] the state's tensors (grad_t or a stand-in) */
  float *standin;      /* [ntensors] stand-in i's one element (finish's output) */
  int64_t standin_shape[1];
  float zero;          /* the stand-ins' partial */
} bench;

/* The block's parameters: experts, router, shared expert (not e_score_correction_bias,
 * a buffer without a gradient). */
static void mark_block(bench *b) {
  const tr_layer_ix *x = &b->m->lx[b->layer];
  int64_t idx[4 + 3 * EXPERTS], n = 0, hi = 0;
  idx[n++] = x->router_w, idx[n++] = x->sh_gate, idx[n++] = x->sh_up, idx[n++] = x->sh_down;
  for (int64_t e = 0; e < 3 * EXPERTS; e++) idx[n++] = x->expert0 + e;
  for (int64_t i = 0; i < n; i++) hi = idx[i] > hi ? idx[i] : hi;
  b->ntensors = (size_t)hi + 1;
  b->in_block = calloc(b->ntensors, 1);
  b->grads = calloc(b->ntensors, sizeof *b->grads);
  b->standin = calloc(b->ntensors, sizeof *b->standin);
  if (!b->in_block || !b->grads || !b->standin) fail("setup", "out of memory");
  for (int64_t i = 0; i < n; i++) b->in_block[idx[i]] = 1;
  b->standin_shape[0] = 1;
  for (size_t i = 0; i < b->ntensors; i++) {
    b->grads[i] = b->m->grad_t[i];
    if (!b->in_block[i]) {
      b->grads[i].data = &b->standin[i];
      b->grads[i].ndim = 1;
      b->grads[i].shape = b->standin_shape;
      b->grads[i].strides = NULL;
      b->grads[i].byte_offset = 0;
    }
  }
}

/* normal(0, 1) from tr_init_normal's counter-based generator. */
static void fill_normal(float *p, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; i++) p[i] = tr_init_normal(seed, 0, (uint64_t)i, 1.0f);
}

/* A workspace of T tokens in chunks of C; the block's input xn2, the
 * gradient of its output (s.dx, as tr_model_grad passes it) filled. */
static tr_work *make_work(const bench *b, int64_t C) {
  tr_work *w = tr_work_make(b->m, b->T, C);
  if (!w) fail("workspace", "out of memory");
  fill_normal(w->act[b->layer].xn2, b->T * HIDDEN, 11);
  fill_normal(w->s.dx, b->T * HIDDEN, 12);
  return w;
}

static void check(bx_status st, const char *what) {
  if (st != BX_OK) {
    fprintf(stderr, "bench_moe: %s: %s: %s\n", what, bx_status_str(st), bx_last_error());
    exit(2);
  }
}

/* The run context of one micro-batch of T tokens at global tokens [0, T),
 * as tr_model_grad sets it up (fp32 GEMMs), with the state s and its
 * first chunk; the pass is set by block_pass. */
static void block_ctx(tr_ctx *c, const bench *b, const mode_run *r, bx_tokred *s, int64_t chunk0,
                      char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  c->n.threads = b->threads;
  c->n.ws = &b->m->ws;
  c->n.s = s;
  c->n.tok0 = 0;
  c->n.chunk0 = chunk0;
  c->n.err = err;
  c->n.errlen = errlen;
  c->m = b->m;
  c->w = r->w;
  c->mode = r->mode;
  c->L = r->w->C;
  c->n_global = b->T;
  c->local_tokens = b->T;
}

/* One pass over the block (pass 0 bounds, 1 adds): forward into x_final,
 * backward from s.dx into s.dtmp (dxn2), and in pass 1 the stand-ins'
 * zero partials. */
static void block_pass(bench *b, tr_ctx *c, int pass) {
  tr_work *w = c->w;
  c->n.pass = pass;
  if (tr_moe_forward(c, b->layer, w->x_final) || tr_moe_backward(c, b->layer, w->s.dx, w->s.dtmp))
    fail("step", c->n.err);
  for (size_t i = 0; pass == 1 && i < b->ntensors; i++) {
    DLTensor zero = b->grads[i];
    zero.data = &b->zero;
    for (int64_t j = 0; !b->in_block[i] && j < w->nch; j++)
      check(bx_tokred_add(c->n.s, i, c->n.chunk0 + j, &zero), "stand-in add");
  }
}

/* One step of the block (the module's comment); seconds of the whole
 * step and of pass 1 + finish. */
static double block_step(bench *b, const mode_run *r, double *pass1) {
  char err[512] = "";
  bx_tokred_opts to = BX_TOKRED_OPTS_DEFAULT;
  to.mode = r->mode;
  bx_tokred *s;
  int64_t cb, ce;
  double t0 = now();
  check(bx_tokred_create(b->grads, b->ntensors, r->w->C, b->T, &to, &s), "tokred create");
  check(bx_tokred_chunks(s, 0, b->T, &cb, &ce), "micro-batch chunks");
  tr_ctx c;
  block_ctx(&c, b, r, s, cb, err, sizeof err);
  block_pass(b, &c, 0);
  check(bx_tokred_agree(s, NULL), "tokred agree");
  double t1 = now();
  block_pass(b, &c, 1);
  check(bx_tokred_finish(s, b->grads, b->ntensors, 1), "tokred finish");
  bx_tokred_destroy(s);
  double t2 = now();
  *pass1 = t2 - t1;
  return t2 - t0;
}

/* FNV-1a over the bits of the block's output, dxn2 and its weight gradients. */
static uint64_t fnv(uint64_t h, const void *p, size_t bytes) {
  const unsigned char *q = p;
  for (size_t i = 0; i < bytes; i++) h = (h ^ q[i]) * 1099511628211ull;
  return h;
}

static uint64_t result_hash(const bench *b, const tr_work *w) {
  size_t th = (size_t)(b->T * HIDDEN) * sizeof(float);
  uint64_t h = fnv(1469598103934665603ull, w->x_final, th);
  h = fnv(h, w->s.dtmp, th);
  for (size_t i = 0; i < b->ntensors; i++)
    if (b->in_block[i]) h = fnv(h, b->m->p[i].grad, (size_t)b->m->p[i].numel * sizeof(float));
  return h;
}

static double torch_time(const char *script, int64_t T, int threads) {
  char cmd[2048]; /* the script's path (< 1024) and the arguments */
  int len = snprintf(cmd, sizeof cmd,
           "python3 '%s' --tokens %lld --hidden %d --experts %d --topk %d --groups %d "
           "--topk-groups %d --inter %d --shared %d --threads %d --iters 3",
           script, (long long)T, HIDDEN, EXPERTS, TOPK, GROUPS, KEPT_GROUPS, EXPERT_INTER, SHARED,
           threads);
  if (len < 0 || (size_t)len >= sizeof cmd) return -1;
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  char line[256];
  double t = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "torch_moe %lf", &t) == 1) break;
  if (pclose(f) != 0) return -1;
  return t;
}

/* The one-layer MoE config of the bench's shapes. */
static void bench_config(tr_config *c) {
  tr_config_tiny(c);
  c->num_hidden_layers = 1;
  c->first_k_dense_replace = 0;
  c->hidden_size = HIDDEN;
  c->n_routed_experts = EXPERTS;
  c->num_experts_per_tok = TOPK;
  c->n_group = GROUPS;
  c->topk_group = KEPT_GROUPS;
  c->moe_intermediate_size = EXPERT_INTER;
  c->n_shared_experts = SHARED;
  c->routed_scaling_factor = ROUTED_SCALING;
}

int main(int argc, char **argv) {
  int use_torch = 0, reps = 5, nthr = 0, thr[MAX_THREAD_COUNTS];
  int64_t T = 1024, chunk = 256;
  char tlist[64] = "1,2", script_buf[1024];
  const char *script = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--torch")) use_torch = 1;
    else if (!strcmp(argv[i], "--torch-script") && i + 1 < argc) script = argv[++i], use_torch = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) snprintf(tlist, sizeof tlist, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoll(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_moe [--torch] [--torch-script PATH] [--threads 1,2] [--reps R] "
                      "[--tokens T] [--chunk C]\n");
      return 2;
    }
  }
  nthr = parse_threads(tlist, thr, MAX_THREAD_COUNTS);
  int bad_threads = nthr < 1;
  for (int i = 0; i < nthr; i++) bad_threads |= thr[i] < 1;
  if (reps < 1 || reps > MAX_REPS || T < 1 || chunk < 1 || bad_threads) {
    fprintf(stderr, "bench_moe: bad --reps (1..%d), --tokens, --chunk or --threads\n", MAX_REPS);
    return 2;
  }
  if (use_torch && !script)
    script = torch_script(script_buf, sizeof script_buf, argv[0], "bench_moe_torch.py");

  tr_config cfg;
  bench_config(&cfg);
  char err[512];
  if (tr_config_check(&cfg, err, sizeof err)) fail("config", err);
  bench b = {.layer = 0, .T = T};
  if (tr_model_create(&cfg, 1, &b.m, err, sizeof err)) fail("model", err);
  mark_block(&b);
  mode_run runs[2] = {{BX_TOKRED_GRID, "grid", make_work(&b, chunk)},
                      {BX_TOKRED_ORDINARY, "ordinary", make_work(&b, T)}};

  char cpu[128];
  cpu_model(cpu, sizeof cpu);
  printf("# bench_moe: the model's MoE block (tr_moe_forward + tr_moe_backward), both passes of a "
         "step; %s\n", cpu);
  printf("# T %lld, hidden %d, %d experts top-%d (%d groups, %d kept), expert intermediate %d, "
         "%d shared; grid: chunk %lld tokens, ordinary: one chunk of T\n",
         (long long)T, HIDDEN, EXPERTS, TOPK, GROUPS, KEPT_GROUPS, EXPERT_INTER, SHARED,
         (long long)chunk);
  printf("# medians of %d steps (seconds); ratios: medians of per-rep ratios of step times%s\n", reps,
         use_torch ? "; torch: bench_moe_torch.py (one forward + backward) in the same reps" : "");
  printf("%4s %9s %9s %9s %9s %9s %9s %10s %10s\n", "thr", "grid", "grid p1", "ordinary", "ord p1",
         "torch", "grid/ord", "torch/grid", "torch/ord");
  int bad = 0;
  uint64_t ref[2] = {0, 0};
  for (int ti = 0; ti < nthr; ti++) {
    b.threads = thr[ti];
    double p1;
    for (int k = 0; k < 2; k++) { /* the warm-up step, and the bits of this thread count */
      block_step(&b, &runs[k], &p1);
      uint64_t h = result_hash(&b, runs[k].w);
      if (ti == 0) {
        ref[k] = h;
      } else if (h != ref[k]) {
        fprintf(stderr, "bench_moe: %s mode: %d threads changed the bits (%016llx vs %016llx with %d)\n",
                runs[k].name, b.threads, (unsigned long long)h, (unsigned long long)ref[k], thr[0]);
        bad = 1;
      }
    }
    double tg[MAX_REPS], tg1[MAX_REPS], to[MAX_REPS], to1[MAX_REPS], tt[MAX_REPS];
    double r_go[MAX_REPS], r_tg[MAX_REPS], r_to[MAX_REPS];
    int nt = 0;
    for (int r = 0; r < reps; r++) {
      tg[r] = block_step(&b, &runs[0], &tg1[r]);
      to[r] = block_step(&b, &runs[1], &to1[r]);
      r_go[r] = tg[r] / to[r];
      double t = use_torch ? torch_time(script, T, b.threads) : -1;
      if (t > 0) {
        tt[nt] = t;
        r_tg[nt] = t / tg[r];
        r_to[nt] = t / to[r];
        nt++;
      }
    }
    printf("%4d %9.4f %9.4f %9.4f %9.4f", b.threads, median(tg, reps), median(tg1, reps),
           median(to, reps), median(to1, reps));
    if (nt > 0)
      printf(" %9.4f %9.3f %10.2f %10.2f\n", median(tt, nt), median(r_go, reps), median(r_tg, nt),
             median(r_to, nt));
    else
      printf(" %9s %9.3f %10s %10s\n", "-", median(r_go, reps), "-", "-");
    fflush(stdout);
  }
  tr_work_free(runs[0].w);
  tr_work_free(runs[1].w);
  free(b.in_block);
  free(b.grads);
  free(b.standin);
  tr_model_destroy(b.m);
  return bad;
}
