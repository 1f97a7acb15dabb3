/*
 * demo.c — the layout-invariance demonstration.
 *
 * Builds the gradients of a small mixture-of-experts model (dense tensors and
 * expert tensors, fp32 and bf16, magnitudes that differ per layer and per
 * expert; a deterministic generator, so every run sees the same values) and
 * computes their global L2 norm
 *   (a) the usual ways: sums of squares in fp32 or fp64, in tensor order,
 *       shuffled, split over 2 "threads" or 2 "ranks", in SIMD lane order;
 *       their bits differ from one another;
 *   (b) with bitexact: 1, 2 and 3 threads, shuffled tensor order, dense and
 *       expert as one group or two, and as 2 or 4 simulated ranks whose
 *       accumulators are summed word by word as int64 (what MPI_SUM or
 *       all_reduce(SUM) on an int64 tensor does); every result has the same
 *       bits.
 * Exits 0 only if all bitexact results are bitwise identical.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bitexact.h>

/* ------------------------------------------------------------------ model */
enum { LAYERS = 4, HIDDEN = 256, VOCAB = 4096, EXPERTS = 8, EXPERT_FFN = 256 };
enum { GROUP_DENSE = 0, GROUP_EXPERT = 1 };
#define MAX_TENSORS 128

typedef struct grad {
  char name[32];
  int group;      /* GROUP_DENSE or GROUP_EXPERT */
  int bf16;       /* 1: uint16_t bf16 bits, 0: float */
  int64_t n;      /* elements */
  void *data;
} grad;

static grad model[MAX_TENSORS];
static int ntensors;

/* splitmix64: small, fast, and the same on every platform. */
static uint64_t next_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) { /* in (0, 1) */
  return ((double)(next_u64(state) >> 11) + 0.5) * 0x1p-53;
}

static double gaussian(uint64_t *state) { /* Box-Muller */
  double u = uniform01(state), v = uniform01(state);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static uint16_t float_to_bf16(float f) { /* round to nearest even, finite f */
  uint32_t b;
  memcpy(&b, &f, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}

static float bf16_to_float(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static float element(const grad *g, int64_t i) {
  return g->bf16 ? bf16_to_float(((const uint16_t *)g->data)[i])
                 : ((const float *)g->data)[i];
}

/* Adds a tensor of n gradient-like values: Gaussian with standard deviation
 * `scale`; in `sparse_rows` mode (an embedding) only ~30% of the rows of
 * HIDDEN elements are non-zero, as for the tokens a batch saw. */
static void add_grad(const char *name, int group, int bf16, int64_t n,
                     double scale, int sparse_rows) {
  grad *g = &model[ntensors];
  uint64_t state = 0x5EED0000ull + (uint64_t)ntensors * 7919u;
  snprintf(g->name, sizeof g->name, "%s", name);
  g->group = group;
  g->bf16 = bf16;
  g->n = n;
  g->data = malloc((size_t)n * (bf16 ? 2 : 4));
  if (!g->data) {
    fprintf(stderr, "demo: out of memory\n");
    exit(2);
  }
  int row_on = 1;
  for (int64_t i = 0; i < n; i++) {
    if (sparse_rows && i % HIDDEN == 0) row_on = uniform01(&state) < 0.3;
    float v = row_on ? (float)(scale * gaussian(&state)) : 0.0f;
    if (bf16)
      ((uint16_t *)g->data)[i] = float_to_bf16(v);
    else
      ((float *)g->data)[i] = v;
  }
  ntensors++;
}

static void build_model(void) {
  char name[32];
  const int64_t d = HIDDEN;
  add_grad("embed", GROUP_DENSE, 0, VOCAB * d, 2e-3, 1);
  for (int l = 0; l < LAYERS; l++) {
    double s = 1e-3 * pow(1.6, l); /* gradients grow towards the output */
    snprintf(name, sizeof name, "l%d.attn_norm", l);
    add_grad(name, GROUP_DENSE, 0, d, 10 * s, 0);
    snprintf(name, sizeof name, "l%d.qkv", l);
    add_grad(name, GROUP_DENSE, 1, 3 * d * d, s, 0);
    snprintf(name, sizeof name, "l%d.out", l);
    add_grad(name, GROUP_DENSE, 1, d * d, 0.7 * s, 0);
    snprintf(name, sizeof name, "l%d.mlp_norm", l);
    add_grad(name, GROUP_DENSE, 0, d, 10 * s, 0);
    snprintf(name, sizeof name, "l%d.router", l);
    add_grad(name, GROUP_DENSE, 0, EXPERTS * d, 3 * s, 0);
    for (int e = 0; e < EXPERTS; e++) {
      /* uneven expert load: some experts see many tokens, some few */
      double load = 0.05 + (double)((e * 5 + l * 3) % EXPERTS) / EXPERTS;
      int bf16 = (l % 2) == 0; /* experts in bf16 on even layers */
      snprintf(name, sizeof name, "l%d.expert%d.w1", l, e);
      add_grad(name, GROUP_EXPERT, bf16, EXPERT_FFN * d, s * load, 0);
      snprintf(name, sizeof name, "l%d.expert%d.w2", l, e);
      add_grad(name, GROUP_EXPERT, bf16, d * EXPERT_FFN, 0.8 * s * load, 0);
    }
  }
  add_grad("final_norm", GROUP_DENSE, 0, d, 2e-2, 0);
  add_grad("lm_head", GROUP_DENSE, 1, VOCAB * d, 4e-3, 0);
}

/* A DLTensor view of elements [lo, hi) of g. shape must outlive the view. */
static DLTensor view(const grad *g, int64_t lo, int64_t hi, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  size_t esize = g->bf16 ? 2 : 4;
  *shape = hi - lo;
  t.data = (char *)g->data + (size_t)lo * esize;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = g->bf16 ? kDLBfloat : kDLFloat;
  t.dtype.bits = g->bf16 ? 16 : 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* ------------------------------------------------------- naive reductions */
static float sumsq_f32(const grad *g, int64_t lo, int64_t hi, float s) {
  for (int64_t i = lo; i < hi; i++) {
    float x = element(g, i);
    s += x * x;
  }
  return s;
}

static double sumsq_f64(const grad *g, int64_t lo, int64_t hi, double s) {
  for (int64_t i = lo; i < hi; i++) {
    double x = element(g, i);
    s += x * x;
  }
  return s;
}

/* What a 16-lane vectorised loop computes: lane k sums elements i with
 * i % 16 == k, lanes are added pairwise at the end of each tensor. */
static float sumsq_f32_simd16(const grad *g) {
  float lane[16] = {0};
  for (int64_t i = 0; i < g->n; i++) {
    float x = element(g, i);
    lane[i % 16] += x * x;
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; k++) lane[k] += lane[k + w];
  return lane[0];
}

static double sumsq_f64_simd8(const grad *g) {
  double lane[8] = {0};
  for (int64_t i = 0; i < g->n; i++) {
    double x = element(g, i);
    lane[i % 8] += x * x;
  }
  for (int w = 4; w >= 1; w /= 2)
    for (int k = 0; k < w; k++) lane[k] += lane[k + w];
  return lane[0];
}

/* ----------------------------------------------------------------- report */
typedef struct result {
  const char *how;
  int fp32;       /* 1: an fp32 result (8 hex digits), 0: fp64 */
  double value;
} result;

static result naive[16], exact[16];
static int nnaive, nexact;
static int failures;

static uint64_t bits_of(double v) {
  uint64_t b;
  memcpy(&b, &v, 8);
  return b;
}

static uint32_t bits_of_f(float v) {
  uint32_t b;
  memcpy(&b, &v, 4);
  return b;
}

static double clip_coef(double norm) {
  double coef = NAN;
  bx_status st = bx_clip_coef(norm, 1.0, NULL, &coef);
  if (st != BX_OK) {
    fprintf(stderr, "bx_clip_coef: %s: %s\n", bx_status_str(st),
            bx_last_error());
    failures++;
  }
  return coef;
}

static void print_row(const result *r, double reference) {
  char bits[24], val[32];
  if (r->fp32) {
    snprintf(bits, sizeof bits, "0x%08x", (unsigned)bits_of_f((float)r->value));
    snprintf(val, sizeof val, "%.9g", r->value);
  } else {
    snprintf(bits, sizeof bits, "0x%016llx", (unsigned long long)bits_of(r->value));
    snprintf(val, sizeof val, "%.17g", r->value);
  }
  printf("  %-52s %-4s %-18s %-20s %+9.1e  0x%016llx\n", r->how,
         r->fp32 ? "fp32" : "fp64", bits, val, (r->value - reference) / reference,
         (unsigned long long)bits_of(clip_coef(r->value)));
}

static void add_naive(const char *how, int fp32, double value) {
  naive[nnaive++] = (result){how, fp32, value};
}

static void add_exact(const char *how, bx_status st, double value) {
  if (st != BX_OK) {
    fprintf(stderr, "demo: %s: %s: %s\n", how, bx_status_str(st),
            bx_last_error());
    failures++;
    value = NAN;
  }
  exact[nexact++] = (result){how, 0, value};
}

static int count_distinct(int fp32) {
  int distinct = 0;
  for (int i = 0; i < nnaive; i++) {
    if (naive[i].fp32 != fp32) continue;
    int seen = 0;
    for (int j = 0; j < i; j++)
      if (naive[j].fp32 == fp32 && bits_of(naive[j].value) == bits_of(naive[i].value))
        seen = 1;
    distinct += !seen;
  }
  return distinct;
}

static int count_kind(int fp32) {
  int n = 0;
  for (int i = 0; i < nnaive; i++) n += naive[i].fp32 == fp32;
  return n;
}

/* ------------------------------------------------------------------- main */
static int order[MAX_TENSORS];   /* a fixed shuffle of the tensor indices */

static void shuffle_order(void) {
  uint64_t state = 0xD15EA5Eull;
  for (int i = 0; i < ntensors; i++) order[i] = i;
  for (int i = ntensors - 1; i > 0; i--) {
    int j = (int)(next_u64(&state) % (uint64_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

static void run_naive(void) {
  float f = 0, half[2] = {0, 0}, rank[2] = {0, 0}, grp[2] = {0, 0};
  float tensor_norms_sq = 0, lanes = 0;
  double d = 0, dshuf = 0, drank[2] = {0, 0}, dlanes = 0;

  for (int i = 0; i < ntensors; i++) {
    const grad *g = &model[i];
    f = sumsq_f32(g, 0, g->n, f);
    float tn = sqrtf(sumsq_f32(g, 0, g->n, 0.0f));
    tensor_norms_sq += tn * tn;
    half[0] = sumsq_f32(g, 0, g->n / 2, half[0]);
    half[1] = sumsq_f32(g, g->n / 2, g->n, half[1]);
    rank[i % 2] = sumsq_f32(g, 0, g->n, rank[i % 2]);
    grp[g->group] = sumsq_f32(g, 0, g->n, grp[g->group]);
    lanes += sumsq_f32_simd16(g);
    d = sumsq_f64(g, 0, g->n, d);
    drank[i % 2] = sumsq_f64(g, 0, g->n, drank[i % 2]);
    dlanes += sumsq_f64_simd8(g);
  }
  float fshuf = 0;
  for (int k = 0; k < ntensors; k++) {
    const grad *g = &model[order[k]];
    fshuf = sumsq_f32(g, 0, g->n, fshuf);
    dshuf = sumsq_f64(g, 0, g->n, dshuf);
  }
  add_naive("one running sum, tensor order", 1, sqrtf(f));
  add_naive("one running sum, shuffled tensor order", 1, sqrtf(fshuf));
  add_naive("per-tensor norms, then norm of norms (torch)", 1,
            sqrtf(tensor_norms_sq));
  add_naive("2 threads: each tensor split in halves", 1, sqrtf(half[0] + half[1]));
  add_naive("2 ranks: tensors dealt alternately", 1, sqrtf(rank[0] + rank[1]));
  add_naive("dense and expert groups reduced separately", 1,
            sqrtf(grp[GROUP_DENSE] + grp[GROUP_EXPERT]));
  add_naive("16-lane SIMD loop per tensor", 1, sqrtf(lanes));
  add_naive("one running sum, tensor order", 0, sqrt(d));
  add_naive("one running sum, shuffled tensor order", 0, sqrt(dshuf));
  add_naive("2 ranks: tensors dealt alternately", 0, sqrt(drank[0] + drank[1]));
  add_naive("8-lane SIMD loop per tensor", 0, sqrt(dlanes));
}

static DLTensor all_views[MAX_TENSORS], shuffled_views[MAX_TENSORS];
static DLTensor group_views[2][MAX_TENSORS];
static int64_t shapes[4][MAX_TENSORS];
static size_t group_count[2];

static double total_norm(const bx_group *groups, size_t ngroups, int threads,
                         bx_status *st, double *group_norms) {
  bx_norm_opts opts = BX_NORM_OPTS_DEFAULT;
  double norm = NAN;
  opts.num_threads = threads;
  *st = bx_total_norm(groups, ngroups, NULL, &opts, &norm, group_norms);
  return norm;
}

/* Simulated ranks: rank r owns shard r of every tensor (FSDP-style flat
 * shards, nranks of them); each rank accumulates its shards, then the
 * accumulators are added word by word as int64, in reverse rank order, as
 * an all-reduce(SUM) would. */
static double ranks_norm(int nranks, bx_status *st) {
  bx_acc acc[4], sum;
  int64_t shape;
  *st = BX_OK;
  for (int r = 0; r < nranks; r++) {
    bx_acc_init(&acc[r]);
    for (int k = 0; k < ntensors && *st == BX_OK; k++) {
      const grad *g = &model[order[k]];
      DLTensor shard = view(g, g->n * r / nranks, g->n * (r + 1) / nranks, &shape);
      *st = bx_acc_add_squares(&acc[r], &shard);
    }
  }
  if (*st != BX_OK) return NAN;
  memset(&sum, 0, sizeof sum);
  int64_t *out = (int64_t *)&sum;
  for (int r = nranks - 1; r >= 0; r--) {
    const int64_t *in = (const int64_t *)&acc[r];
    for (size_t w = 0; w < BX_ACC_WORDS; w++) out[w] += in[w];
  }
  *st = bx_acc_check(&sum);
  return *st == BX_OK ? bx_acc_sqrt(&sum) : NAN;
}

static void run_exact(double group_norms[2]) {
  bx_status st;
  double gn[2];
  for (int i = 0; i < ntensors; i++) {
    const grad *g = &model[i];
    all_views[i] = view(g, 0, g->n, &shapes[0][i]);
    const grad *s = &model[order[i]];
    shuffled_views[i] = view(s, 0, s->n, &shapes[1][i]);
    int gi = s->group;
    group_views[gi][group_count[gi]] =
        view(s, 0, s->n, &shapes[2 + gi][group_count[gi]]);
    group_count[gi]++;
  }
  bx_group one = {all_views, (size_t)ntensors};
  bx_group shuf = {shuffled_views, (size_t)ntensors};
  bx_group two[2] = {{group_views[GROUP_DENSE], group_count[GROUP_DENSE]},
                     {group_views[GROUP_EXPERT], group_count[GROUP_EXPERT]}};
  bx_group two_rev[2] = {two[1], two[0]};
  double v;

  v = total_norm(&one, 1, 1, &st, NULL);
  add_exact("bx_total_norm, 1 thread, tensor order", st, v);
  v = total_norm(&one, 1, 2, &st, NULL);
  add_exact("bx_total_norm, 2 threads, tensor order", st, v);
  v = total_norm(&shuf, 1, 1, &st, NULL);
  add_exact("bx_total_norm, 1 thread, shuffled order", st, v);
  v = total_norm(&shuf, 1, 2, &st, NULL);
  add_exact("bx_total_norm, 2 threads, shuffled order", st, v);
  v = total_norm(two, 2, 1, &st, group_norms);
  add_exact("bx_total_norm, groups dense + expert, 1 thread", st, v);
  v = total_norm(two_rev, 2, 2, &st, gn);
  add_exact("bx_total_norm, groups expert + dense, 2 threads", st, v);
  if (st == BX_OK && (bits_of(gn[0]) != bits_of(group_norms[GROUP_EXPERT]) ||
                      bits_of(gn[1]) != bits_of(group_norms[GROUP_DENSE]))) {
    fprintf(stderr, "demo: group norms differ between runs\n");
    failures++;
  }
  v = total_norm(two, 2, 3, &st, NULL);
  add_exact("bx_total_norm, groups dense + expert, 3 threads", st, v);
  v = ranks_norm(2, &st);
  add_exact("2 ranks: FSDP shards, int64 sum of bx_acc words", st, v);
  v = ranks_norm(4, &st);
  add_exact("4 ranks: FSDP shards, int64 sum of bx_acc words", st, v);
}

int main(void) {
  double group_norms[2] = {NAN, NAN};
  int64_t total = 0, per_group[2] = {0, 0}, nbf16 = 0;

  build_model();
  shuffle_order();
  for (int i = 0; i < ntensors; i++) {
    total += model[i].n;
    per_group[model[i].group] += model[i].n;
    nbf16 += model[i].bf16 ? model[i].n : 0;
  }
  printf("bitexact demo: global L2 norm of a small MoE model's gradients\n");
  printf("  %d tensors, %lld elements (dense %lld, expert %lld; %lld bf16, "
         "%lld fp32), %d layers x %d experts\n\n",
         ntensors, (long long)total, (long long)per_group[0],
         (long long)per_group[1], (long long)nbf16, (long long)(total - nbf16),
         LAYERS, EXPERTS);

  run_naive();
  run_exact(group_norms);
  double reference = exact[0].value;

  printf("  %-52s %-4s %-18s %-20s %9s  %s\n", "how the norm was computed",
         "acc", "bits of the norm", "value", "rel. err", "clip coef (max_norm=1)");
  printf("  (a) naive float reductions\n");
  for (int i = 0; i < nnaive; i++) print_row(&naive[i], reference);
  printf("  (b) bitexact\n");
  for (int i = 0; i < nexact; i++) print_row(&exact[i], reference);

  int same = 1;
  for (int i = 1; i < nexact; i++)
    same &= bits_of(exact[i].value) == bits_of(exact[0].value);
  same &= failures == 0;
  printf("\n  group norms (bitexact): dense %.17g, expert %.17g\n",
         group_norms[GROUP_DENSE], group_norms[GROUP_EXPERT]);
  printf("  naive fp32: %d distinct results from %d ways of summing; "
         "naive fp64: %d distinct from %d\n",
         count_distinct(1), count_kind(1), count_distinct(0), count_kind(0));
  printf("bitexact: all %d results bitwise identical: %s\n", nexact,
         same ? "yes" : "NO");

  for (int i = 0; i < ntensors; i++) free(model[i].data);
  return same ? 0 : 1;
}
