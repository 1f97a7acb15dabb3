/*
 * test_megatron.c — a Megatron-like layout on 8 ranks: TP=2 x EP=2 x DP=2
 * (rank = dp*4 + ep*2 + tp), dense and expert groups.
 *   - dense: embedding and QKV/FC1 split by rows over TP, proj/FC2 split by
 *     columns (a column slice is a strided view: we own it as per-row
 *     pieces), LayerNorm weights/biases duplicated on both TP ranks;
 *     replicated over EP and DP;
 *   - experts: 4 per layer, expert e on EP rank e/2, split over TP,
 *     replicated over DP.
 * Ownership: a TP duplicate by TP rank 0, a DP replica by DP rank 0, a
 * dense weight replicated over EP by EP rank 0. With that, every rank's
 * norm is bitwise the unsharded model's. The classic mistakes are then
 * shown to give different numbers: counting TP duplicates on every TP rank,
 * and reducing only inside a DP replica with ZeRO-style ownership (rank-
 * local over DP, and the average of those DP-local norms).
 *   mpirun -np 8 build/tests/mpi/test_megatron
 */
#include "dist_util.h"

#define H 64
#define F 96
#define V 500
#define LAYERS 3
#define EXPERTS 4
#define MAXT 64

enum { DENSE = 0, EXPERT = 1 };
enum kind { ROWS, COLS, DUP }; /* TP split by rows, by columns, or duplicated */

typedef struct param {
  tensor full; /* the unsharded gradient (DP replicas are identical) */
  size_t rows, cols;
  enum kind kind;
  int expert; /* -1 for dense */
} param;

static param params[MAXT];
static int nparams;

static void add(rng *r, int group, size_t rows, size_t cols, enum kind k, int expert,
                DLDataType dt) {
  param *p = &params[nparams++];
  p->full = tensor_new(dt, rows * cols, group);
  p->rows = rows;
  p->cols = cols;
  p->kind = k;
  p->expert = expert;
  tensor_fill(&p->full, r, 1e-3 * (1 + nparams % 5));
}

static void build(void) {
  rng r = rng_seeded(8);
  add(&r, DENSE, V, H, ROWS, -1, DT_F32);
  for (int l = 0; l < LAYERS; l++) {
    add(&r, DENSE, H, 1, DUP, -1, DT_F32); /* ln1 weight */
    add(&r, DENSE, H, 1, DUP, -1, DT_F32); /* ln1 bias */
    add(&r, DENSE, 3 * H, H, ROWS, -1, DT_BF16);
    add(&r, DENSE, H, H, COLS, -1, DT_BF16);
    add(&r, DENSE, H, 1, DUP, -1, DT_F32); /* proj bias (row-parallel: dup) */
    add(&r, DENSE, H, 1, DUP, -1, DT_F32); /* ln2 */
    for (int e = 0; e < EXPERTS; e++) {
      add(&r, EXPERT, F, H, ROWS, e, DT_BF16);
      add(&r, EXPERT, H, F, COLS, e, DT_BF16);
    }
  }
}

typedef struct layout {
  int tp, ep, dp;
  int dup_on_all_tp;   /* mistake: TP duplicates counted on every TP rank */
  int zero_dp_owner;   /* ZeRO-style: DP rank (param index % 2) owns a param */
} layout;

/* What rank (tp, ep, dp) owns of parameter p, added to o. */
static void own(owned *o, const param *p, int idx, layout L) {
  int dp_owner = L.zero_dp_owner ? idx % 2 : 0;
  if (L.dp != dp_owner) return;
  if (p->expert < 0 && L.ep != 0) return;            /* dense: replicated over EP */
  if (p->expert >= 0 && L.ep != p->expert / 2) return; /* expert lives on one EP rank */
  if (p->kind == DUP) {
    if (L.tp == 0 || L.dup_on_all_tp) owned_add(o, &p->full, 0, p->full.n);
  } else if (p->kind == ROWS) {
    size_t half = p->rows / 2;
    owned_add(o, &p->full, (size_t)L.tp * half * p->cols, half * p->cols);
  } else { /* COLS: this TP rank's column slice is one piece per row */
    size_t half = p->cols / 2;
    for (size_t r = 0; r < p->rows; r++) owned_add(o, &p->full, r * p->cols + (size_t)L.tp * half, half);
  }
}

static double norm_with(layout L, MPI_Comm mc, double *groups) {
  owned o;
  owned_init(&o, 4096);
  for (int i = 0; i < nparams; i++) own(&o, &params[i], i, L);
  bx_comm comm = bx_comm_mpi(mc);
  double v = -1;
  bx_status st = bx_total_norm(owned_groups(&o, 2), 2, &comm, NULL, &v, groups);
  CHECK(st == BX_OK, "norm: %s", bx_last_error());
  owned_free(&o);
  return v;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size != 8) {
    if (g_rank == 0) printf("test_megatron: needs 8 ranks (has %d): skipped\n", g_size);
    MPI_Finalize();
    return 0;
  }
  build();
  layout L = {g_rank % 2, (g_rank / 2) % 2, g_rank / 4, 0, 0};

  /* the unsharded model, one process */
  owned whole;
  owned_init(&whole, MAXT);
  for (int i = 0; i < nparams; i++) owned_add(&whole, &params[i].full, 0, params[i].full.n);
  double ref, ref_g[2];
  CHECK(bx_total_norm(owned_groups(&whole, 2), 2, NULL, NULL, &ref, ref_g) == BX_OK, "ref");

  double g[2];
  double v = norm_with(L, MPI_COMM_WORLD, g);
  CHECK(same_bits(v, ref), "owned TPxEPxDP norm %a != unsharded %a", v, ref);
  CHECK(same_bits(g[0], ref_g[0]) && same_bits(g[1], ref_g[1]),
        "group norms (%a, %a) != unsharded (%a, %a)", g[0], g[1], ref_g[0], ref_g[1]);

  /* ZeRO-style ownership across DP, reduced over the whole world: still exact */
  layout Z = L;
  Z.zero_dp_owner = 1;
  v = norm_with(Z, MPI_COMM_WORLD, g);
  CHECK(same_bits(v, ref), "ZeRO-style DP ownership %a != unsharded %a", v, ref);

  /* mistake 1: TP duplicates counted on both TP ranks */
  layout M1 = L;
  M1.dup_on_all_tp = 1;
  double dup_twice = norm_with(M1, MPI_COMM_WORLD, g);
  CHECK(dup_twice > ref, "counting TP duplicates twice should inflate the norm (%a vs %a)",
        dup_twice, ref);

  /* mistake 2: reduce only inside one DP replica (TP x EP ranks) while DP
   * ranks own different halves: a rank-local (DP-local) norm */
  MPI_Comm dp_local;
  MPI_Comm_split(MPI_COMM_WORLD, L.dp, g_rank, &dp_local);
  double local = norm_with(Z, dp_local, g);
  CHECK(local < ref, "DP-local norm %a should under-report the global %a", local, ref);
  /* and the average of the two DP-local norms is not the global norm */
  double both[2] = {0, 0}, mean;
  both[L.dp] = local;
  double sum[2];
  MPI_Allreduce(both, sum, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  mean = 0.5 * (sum[0] + sum[1]);
  CHECK(!same_bits(mean, ref), "averaging DP-local norms happened to equal the global norm");
  if (g_rank == 0)
    printf("test_megatron: unsharded %.17g | TP dups on every TP rank %.17g | DP-local "
           "%.17g / %.17g (mean %.17g)\n",
           ref, dup_twice, sum[0], sum[1], mean);
  MPI_Comm_free(&dp_local);
  owned_free(&whole);
  int bad = dist_finish("test_megatron");
  for (int i = 0; i < nparams; i++) free(params[i].full.data);
  MPI_Finalize();
  return bad;
}
