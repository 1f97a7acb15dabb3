/*
 * demo.c — `bitexact demo`: layout invariance on the gradients of a small
 * mixture-of-experts transformer, built in (a fixed generator, so every run
 * and every rank sees the same values).
 *
 * Layouts: 1, 2, 4, 8 ranks x 1, 2 threads x model / shuffled tensor order.
 * Ownership (DESIGN §5): expert e of every layer belongs to rank e % R
 * (expert parallelism); every dense tensor is cut into R contiguous flat
 * shards, shard r on rank r (FSDP). Naive: each thread sums squares in fp32
 * over its part, the rank adds its threads' sums, the ranks' sums are
 * all-reduced in fp32 (a tree), then sqrtf. bitexact: bx_total_norm on
 * every rank with a bx_comm (MPI ranks, or threads of this process whose
 * all-reduce adds the int64 words of all rank threads).
 */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "demo.h"
#include "rng.h"

enum { LAYERS = 4, HIDDEN = 256, VOCAB = 4096, EXPERTS = 8, EXPERT_FFN = 256, DENSE_FFN = 512 };

typedef struct dgrad {
  char name[48];
  int expert;   /* -1: dense; else the expert index (its owner is expert % R) */
  int bf16;     /* 1: uint16_t bf16 bits, 0: float */
  int64_t n;
  void *data;
} dgrad;

static dgrad model[DEMO_MAX_TENSORS];
static int ntensors;


static uint16_t to_bf16(float f) { /* nearest even; finite f */
  uint32_t b;
  memcpy(&b, &f, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static int add_grad(const char *name, int expert, int bf16, int64_t n, double scale, int sparse) {
  dgrad *g = &model[ntensors];
  bx_rng s;
  bx_rng_seed(&s, 0xB17E4AC7ull + (uint64_t)ntensors * 7919u);
  snprintf(g->name, sizeof g->name, "%s", name);
  g->expert = expert;
  g->bf16 = bf16;
  g->n = n;
  g->data = malloc((size_t)n * (bf16 ? 2 : 4));
  if (!g->data) return -1;
  int on = 1;
  for (int64_t i = 0; i < n; i++) {
    if (sparse && i % HIDDEN == 0) on = bx_rng_uniform(&s) < 0.3; /* rows the batch saw */
    float v = on ? (float)(scale * bx_rng_normal(&s)) : 0.0f;
    if (bf16) ((uint16_t *)g->data)[i] = to_bf16(v);
    else ((float *)g->data)[i] = v;
  }
  ntensors++;
  return 0;
}

static int build_model(void) {
  char nm[64];
  int rc = 0;
  const int64_t d = HIDDEN;
  rc |= add_grad("embed.weight", -1, 0, VOCAB * d, 2e-3, 1);
  for (int l = 0; l < LAYERS; l++) {
    double s = 1e-3 * pow(1.5, l);
#define ADD(suffix, ex, bf, n, sc)                                     \
  snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix);                  \
  rc |= add_grad(nm, ex, bf, n, sc, 0)
    ADD("attn_norm.weight", -1, 0, d, 10 * s);
    ADD("attn.qkv.weight", -1, 1, 3 * d * d, s);
    ADD("attn.out.weight", -1, 1, d * d, 0.7 * s);
    ADD("mlp_norm.weight", -1, 0, d, 10 * s);
    ADD("mlp.shared.w1", -1, 0, d * DENSE_FFN, 0.8 * s);
    ADD("mlp.shared.w2", -1, 0, DENSE_FFN * d, 0.6 * s);
    ADD("mlp.router.weight", -1, 0, EXPERTS * d, 3 * s);
    for (int e = 0; e < EXPERTS; e++) {
      double load = 0.05 + (double)((e * 5 + l * 3) % EXPERTS) / EXPERTS; /* uneven */
      char sfx[32];
      snprintf(sfx, sizeof sfx, "mlp.experts.%d.w1", e);
      ADD(sfx, e, l % 2 == 0, EXPERT_FFN * d, s * load);
      snprintf(sfx, sizeof sfx, "mlp.experts.%d.w2", e);
      ADD(sfx, e, l % 2 == 0, d * EXPERT_FFN, 0.8 * s * load);
    }
#undef ADD
  }
  rc |= add_grad("final_norm.weight", -1, 0, d, 2e-2, 0);
  rc |= add_grad("lm_head.weight", -1, 1, VOCAB * d, 4e-3, 0);
  return rc;
}

static void free_model(void) {
  for (int i = 0; i < ntensors; i++) free(model[i].data);
  ntensors = 0;
}

/* Tensor indices in rank r's order: model order or a fixed shuffle. */
static int rank_order(int R, int r, int shuffled, int *idx) {
  int n = 0;
  for (int i = 0; i < ntensors; i++)
    if (model[i].expert < 0 || model[i].expert % R == r) idx[n++] = i;
  if (shuffled) {
    bx_rng s;
    bx_rng_seed(&s, 0xD15EA5Eull + (uint64_t)(R * 16 + r));
    for (int i = n - 1; i > 0; i--) {
      int j = (int)bx_rng_below(&s, (uint64_t)(i + 1)), t = idx[i];
      idx[i] = idx[j];
      idx[j] = t;
    }
  }
  return n;
}

/* Elements [lo, hi) of rank r's piece of tensor i. */
static void owned_range(int R, int r, int i, int64_t *lo, int64_t *hi) {
  if (model[i].expert >= 0) {
    *lo = 0, *hi = model[i].n;
  } else {
    *lo = model[i].n * r / R, *hi = model[i].n * (r + 1) / R;
  }
}

void demo_rank_groups(int R, int r, int shuffled, DLTensor *views, int64_t *shapes,
                      bx_group groups[2]) {
  int idx[DEMO_MAX_TENSORS];
  int n = rank_order(R, r, shuffled, idx), k = 0;
  for (int grp = 0; grp < 2; grp++) {
    groups[grp].tensors = &views[k];
    for (int m = 0; m < n; m++) {
      const dgrad *g = &model[idx[m]];
      if ((g->expert >= 0) != grp) continue;
      int64_t lo, hi;
      owned_range(R, r, idx[m], &lo, &hi);
      DLTensor *t = &views[k];
      memset(t, 0, sizeof *t);
      shapes[k] = hi - lo;
      t->data = (char *)g->data + (size_t)lo * (g->bf16 ? 2 : 4);
      t->device.device_type = kDLCPU;
      t->ndim = 1;
      t->dtype.code = g->bf16 ? kDLBfloat : kDLFloat;
      t->dtype.bits = g->bf16 ? 16 : 32;
      t->dtype.lanes = 1;
      t->shape = &shapes[k];
      k++;
    }
    groups[grp].count = (size_t)(&views[k] - groups[grp].tensors);
  }
}

float demo_naive_rank(int R, int r, int T, int shuffled) {
  int idx[DEMO_MAX_TENSORS];
  int n = rank_order(R, r, shuffled, idx);
  float part[2] = {0, 0};
  for (int t = 0; t < T; t++)
    for (int m = 0; m < n; m++) {
      const dgrad *g = &model[idx[m]];
      int64_t lo, hi;
      owned_range(R, r, idx[m], &lo, &hi);
      int64_t a = lo + (hi - lo) * t / T, b = lo + (hi - lo) * (t + 1) / T;
      float s = part[t];
      for (int64_t i = a; i < b; i++) {
        float x = g->bf16 ? from_bf16(((const uint16_t *)g->data)[i]) : ((const float *)g->data)[i];
        s += x * x;
      }
      part[t] = s;
    }
  return T == 1 ? part[0] : part[0] + part[1];
}

float demo_tree_sum(const float *v, int n) {
  float buf[DEMO_MAX_RANKS];
  memcpy(buf, v, (size_t)n * sizeof *v);
  for (int w = 1; w < n; w *= 2)
    for (int i = 0; i + w < n; i += 2 * w) buf[i] += buf[i + w];
  return buf[0];
}

/* ---- simulated ranks: threads of this process with an int64 all-reduce */
typedef struct sim_world {
  int R, T, shuffled;
  pthread_barrier_t bar;
  int64_t *slot[DEMO_MAX_RANKS];
  size_t n[DEMO_MAX_RANKS];
  double exact[DEMO_MAX_RANKS], groups[DEMO_MAX_RANKS][2];
  bx_status st[DEMO_MAX_RANKS];
  char error[200];
} sim_world;

typedef struct sim_rank {
  sim_world *w;
  int r;
} sim_rank;

#define SIM_MAX_WORDS 4096

static int sim_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  sim_rank *me = ctx;
  sim_world *w = me->w;
  int64_t tmp[SIM_MAX_WORDS];
  w->slot[me->r] = buf;
  w->n[me->r] = n;
  pthread_barrier_wait(&w->bar);
  int ok = n <= SIM_MAX_WORDS;
  for (int r = 0; r < w->R; r++) ok &= w->n[r] == n;
  for (size_t i = 0; ok && i < n; i++) {
    uint64_t acc = (uint64_t)w->slot[0][i];
    for (int r = 1; r < w->R; r++) {
      int64_t v = w->slot[r][i];
      if (op == BX_OP_SUM) acc += (uint64_t)v;
      else if (v > (int64_t)acc) acc = (uint64_t)v;
    }
    tmp[i] = (int64_t)acc;
  }
  pthread_barrier_wait(&w->bar); /* everyone has read every slot */
  if (ok) memcpy(buf, tmp, n * sizeof *buf);
  return ok ? 0 : 1;
}

static void *sim_rank_main(void *arg) {
  sim_rank *me = arg;
  sim_world *w = me->w;
  DLTensor views[DEMO_MAX_TENSORS];
  int64_t shapes[DEMO_MAX_TENSORS];
  bx_group groups[2];
  demo_rank_groups(w->R, me->r, w->shuffled, views, shapes, groups);
  bx_comm comm = BX_COMM_DEFAULT;
  comm.allreduce_i64 = sim_allreduce;
  comm.ctx = me;
  comm.rank = me->r;
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.num_threads = w->T;
  w->st[me->r] = bx_total_norm(groups, 2, &comm, &o, &w->exact[me->r], w->groups[me->r]);
  if (w->st[me->r] != BX_OK && me->r == 0)
    snprintf(w->error, sizeof w->error, "%s: %s", bx_status_str(w->st[me->r]), bx_last_error());
  return NULL;
}

static void sim_layout(int R, int T, int shuffled, demo_result *res) {
  sim_world w;
  sim_rank ranks[DEMO_MAX_RANKS];
  pthread_t tid[DEMO_MAX_RANKS];
  memset(&w, 0, sizeof w);
  w.R = R, w.T = T, w.shuffled = shuffled;
  res->via = "threads";
  res->ok = 0;
  if (pthread_barrier_init(&w.bar, NULL, (unsigned)R) != 0) {
    snprintf(res->error, sizeof res->error, "cannot create a barrier");
    return;
  }
  int started = 0;
  for (int r = 0; r < R; r++) {
    ranks[r] = (sim_rank){&w, r};
    if (pthread_create(&tid[r], NULL, sim_rank_main, &ranks[r]) != 0) break;
    started++;
  }
  if (started < R) { /* cannot happen in practice; the started ranks would wait forever */
    snprintf(res->error, sizeof res->error, "cannot start %d rank threads", R);
    for (int r = 0; r < started; r++) pthread_cancel(tid[r]);
  }
  for (int r = 0; r < started; r++) pthread_join(tid[r], NULL);
  pthread_barrier_destroy(&w.bar);
  if (started < R) return;
  float parts[DEMO_MAX_RANKS];
  for (int r = 0; r < R; r++) parts[r] = demo_naive_rank(R, r, T, shuffled);
  res->naive = sqrtf(demo_tree_sum(parts, R));
  res->ok = 1;
  res->ranks_agree = 1;
  for (int r = 0; r < R; r++) {
    if (w.st[r] != BX_OK) {
      res->ok = 0;
      snprintf(res->error, sizeof res->error, "rank %d: %s", r, w.error[0] ? w.error : bx_status_str(w.st[r]));
      return;
    }
    if (cli_bits_f64(w.exact[r]) != cli_bits_f64(w.exact[0])) res->ranks_agree = 0;
  }
  res->exact = w.exact[0];
  res->groups[0] = w.groups[0][0];
  res->groups[1] = w.groups[0][1];
}

/* ---- the table ---------------------------------------------------------- */
static uint32_t bits32(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

int cmd_demo(int argc, char **argv) {
  cli_opts o = {0, 0, -1, 0};
  for (int i = 1; i < argc; i++) {
    int c = cli_common_opt(argc, argv, &i, &o);
    if (c < 0) return CLI_ERROR;
    if (!c) {
      cli_error("demo: unknown argument '%s' (usage: bitexact demo [--json])", argv[i]);
      return CLI_ERROR;
    }
  }
  int wrank = 0, wsize = 1;
  int mpi = demo_mpi_init(&wrank, &wsize);
  int status = CLI_OK;
  if (build_model() != 0) {
    cli_error("demo: out of memory for the model");
    free_model();
    return mpi ? demo_mpi_finish(CLI_ERROR) : CLI_ERROR;
  }
  static const int rank_counts[4] = {1, 2, 4, 8};
  demo_result res[16];
  int nres = 0;
  for (int ri = 0; ri < 4; ri++)
    for (int T = 1; T <= 2; T++)
      for (int sh = 0; sh <= 1; sh++) {
        demo_result *r = &res[nres++];
        memset(r, 0, sizeof *r);
        r->ranks = rank_counts[ri], r->threads = T, r->shuffled = sh;
        if (mpi && r->ranks <= wsize) demo_mpi_layout(r->ranks, T, sh, r);
        else if (wrank == 0) sim_layout(r->ranks, T, sh, r);
      }
  if (wrank != 0) {
    free_model();
    return demo_mpi_finish(CLI_OK);
  }
  int64_t elems = 0;
  for (int i = 0; i < ntensors; i++) elems += model[i].n;
  int distinct_exact = 0, distinct_naive = 0, errors = 0, disagree = 0;
  for (int i = 0; i < nres; i++) {
    int seen_e = 0, seen_n = 0;
    if (!res[i].ok) {
      errors++;
      cli_error("demo: %d ranks, %d threads: %s", res[i].ranks, res[i].threads, res[i].error);
      continue;
    }
    disagree += !res[i].ranks_agree;
    bx_status st = bx_clip_coef(res[i].exact, 1.0, NULL, &res[i].coef);
    if (st != BX_OK) errors++;
    for (int k = 0; k < i; k++) {
      seen_e |= res[k].ok && cli_bits_f64(res[k].exact) == cli_bits_f64(res[i].exact);
      seen_n |= res[k].ok && bits32(res[k].naive) == bits32(res[i].naive);
    }
    distinct_exact += !seen_e;
    distinct_naive += !seen_n;
  }
  int identical = errors == 0 && disagree == 0 && distinct_exact == 1;
  FILE *out = cli_out();
  if (o.json) {
    json_t *root = json_object(), *arr = json_array();
    char hx[40];
    for (int i = 0; i < nres; i++) {
      demo_result *r = &res[i];
      if (!r->ok) continue;
      json_t *e = json_pack("{s:i,s:i,s:s,s:s,s:f,s:f,s:f,s:f,s:f,s:b}", "ranks", r->ranks,
                            "threads", r->threads, "order", r->shuffled ? "shuffled" : "model",
                            "via", r->via, "naive_fp32", (double)r->naive, "bitexact", r->exact,
                            "dense", r->groups[0], "expert", r->groups[1], "clip_coef", r->coef,
                            "ranks_agree", r->ranks_agree);
      char nb[16];
      snprintf(nb, sizeof nb, "0x%08x", (unsigned)bits32(r->naive));
      json_object_set_new(e, "naive_fp32_bits", json_string(nb));
      snprintf(hx, sizeof hx, "0x%016llx", (unsigned long long)cli_bits_f64(r->exact));
      json_object_set_new(e, "bitexact_bits", json_string(hx));
      snprintf(hx, sizeof hx, "0x%016llx", (unsigned long long)cli_bits_f64(r->coef));
      json_object_set_new(e, "clip_coef_bits", json_string(hx));
      json_array_append_new(arr, e);
    }
    json_object_set_new(root, "elements", json_integer((json_int_t)elems));
    json_object_set_new(root, "tensors", json_integer(ntensors));
    json_object_set_new(root, "layouts", arr);
    json_object_set_new(root, "naive_distinct", json_integer(distinct_naive));
    json_object_set_new(root, "bitexact_distinct", json_integer(distinct_exact));
    json_object_set_new(root, "identical", json_boolean(identical));
    json_object_set_new(root, "mpi_world_size", json_integer(mpi ? wsize : 0));
    json_dumpf(root, out, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    fputc('\n', out);
    json_decref(root);
  } else {
    fprintf(out,
            "bitexact demo: gradients of a small MoE transformer (%d layers, %d experts per layer,\n"
            "embeddings, attention, dense MLP; fp32 + bf16): %d tensors, %lld elements.\n"
            "Ranks: %s. Global L2 norm per layout; clip coefficient for max_norm 1.0.\n\n",
            LAYERS, EXPERTS, ntensors, (long long)elems,
            mpi ? "MPI ranks up to the mpirun size, threads-as-ranks beyond"
                : "simulated (threads of this process, int64 all-reduce)");
    fprintf(out, "%-5s %-7s %-8s %-7s | %-12s %-10s | %-20s %-18s | %-12s %s\n", "ranks", "threads",
            "order", "via", "naive fp32", "bits", "bitexact (fp64)", "bits", "clip coef", "bits");
    for (int i = 0; i < nres; i++) {
      demo_result *r = &res[i];
      if (!r->ok) continue;
      fprintf(out, "%-5d %-7d %-8s %-7s | %-12.9g 0x%08x | %-20.17g 0x%016llx | %-12.9g 0x%016llx\n",
              r->ranks, r->threads, r->shuffled ? "shuffled" : "model", r->via, (double)r->naive,
              (unsigned)bits32(r->naive), r->exact, (unsigned long long)cli_bits_f64(r->exact),
              r->coef, (unsigned long long)cli_bits_f64(r->coef));
    }
    fprintf(out, "\ngroup norms (bitexact): dense %.17g, expert %.17g\n", res[0].groups[0], res[0].groups[1]);
    fprintf(out, "naive fp32: %d distinct results in %d layouts\n", distinct_naive, nres);
    fprintf(out, "bitexact:   %d distinct result%s in %d layouts: %s\n", distinct_exact,
            distinct_exact == 1 ? "" : "s", nres,
            identical ? "identical bits in every layout" : "BITS DIFFER (a bug: please report)");
  }
  if (errors) status = CLI_ERROR;
  else if (!identical) status = CLI_DIFFER;
  free_model();
  return mpi ? demo_mpi_finish(status) : status;
}
