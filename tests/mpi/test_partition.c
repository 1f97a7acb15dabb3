/*
 * test_partition.c — a random mixed-dtype gradient set (fp32, bf16, fp16,
 * fp64; hundreds of tensors; empty ones; three groups) partitioned over the
 * ranks in many random ways — whole tensors to random ranks, tensors split
 * mid-tensor across ranks, ranks holding nothing. For every p and both
 * flavours, every rank's total and per-group norms must be bitwise equal to
 * the single-process norm of the whole model; bx_clip_grad_norm's
 * coefficient too, and every clipped shard must be bitwise equal to the
 * same elements of the single-process clipped model.
 *
 *   mpirun -np P build/tests/mpi/test_partition [trials]
 */
#include "dist_util.h"

#define NT 240
#define NGROUPS 3

static tensor model[NT];

static void make_model(uint64_t seed) {
  rng r = rng_seeded(seed);
  const DLDataType dts[4] = {DT_F32, DT_BF16, DT_F16, DT_F64};
  for (int i = 0; i < NT; i++) {
    size_t n = (rng_next(&r) % 8 == 0) ? 0 : 1 + rng_next(&r) % 3000;
    if (i % 50 == 7) n = 20000 + rng_next(&r) % 20000; /* a few larger ones */
    model[i] = tensor_new(dts[rng_next(&r) % 4], n, (int)(rng_next(&r) % NGROUPS));
    double scale = pow(10.0, -4.0 + 3.0 * rng_unit(&r));
    tensor_fill(&model[i], &r, scale);
  }
}

/* The pieces this rank owns in partition `trial` (same draw on all ranks). */
static void partition(owned *o, int trial) {
  rng r = rng_seeded(1000 + (uint64_t)trial);
  owned_reset(o);
  int idle = g_size > 2 ? (int)(rng_next(&r) % (uint64_t)g_size) : -1; /* holds nothing */
  for (int i = 0; i < NT; i++) {
    const tensor *t = &model[i];
    size_t off = 0;
    int pieces = (rng_next(&r) % 3 == 0) ? 1 + (int)(rng_next(&r) % 4) : 1;
    for (int k = 0; k < pieces; k++) {
      size_t len = k == pieces - 1 ? t->n - off : (t->n - off) * (rng_next(&r) % 100) / 100;
      int owner = (int)(rng_next(&r) % (uint64_t)g_size);
      if (owner == idle) owner = (owner + 1) % g_size;
      int keep_empty = (int)(rng_next(&r) % 2); /* drawn on every rank alike */
      if (owner == g_rank && (len > 0 || keep_empty)) owned_add(o, t, off, len);
      off += len;
    }
  }
}

static void whole_model(owned *o) {
  owned_reset(o);
  for (int i = 0; i < NT; i++) owned_add(o, &model[i], 0, model[i].n);
}

static const double P_VALUES[] = {2.0, 1.0, INFINITY, -INFINITY, 0.0, 3.0, 0.5};
#define NP (sizeof P_VALUES / sizeof P_VALUES[0])

static void test_norms(int trials) {
  bx_comm comm = bx_comm_mpi(MPI_COMM_WORLD);
  owned whole, mine;
  owned_init(&whole, NT);
  owned_init(&mine, 5 * NT);
  whole_model(&whole);
  for (size_t pi = 0; pi <= NP; pi++) {
    bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
    if (pi == NP) o.flavor = BX_MEGATRON_FP32;
    else o.norm_type = P_VALUES[pi];
    double ref, ref_g[NGROUPS];
    bx_status st = bx_total_norm(owned_groups(&whole, NGROUPS), NGROUPS, NULL, &o, &ref, ref_g);
    CHECK(st == BX_OK, "reference p=%g: %s", o.norm_type, bx_last_error());
    for (int t = 0; t < trials; t++) {
      partition(&mine, t);
      o.num_threads = 1 + t % 3;
      double v = -1, vg[NGROUPS];
      st = bx_total_norm(owned_groups(&mine, NGROUPS), NGROUPS, &comm, &o, &v, vg);
      CHECK(st == BX_OK, "p=%g trial %d: %s", o.norm_type, t, bx_last_error());
      CHECK(same_bits(v, ref), "p=%g flavor %d trial %d: total %a != single-process %a",
            o.norm_type, o.flavor, t, v, ref);
      for (int g = 0; g < NGROUPS; g++)
        CHECK(same_bits(vg[g], ref_g[g]), "p=%g trial %d group %d: %a != %a", o.norm_type, t,
              g, vg[g], ref_g[g]);
    }
  }
  owned_free(&whole);
  owned_free(&mine);
}

/* Clip: a private copy of the model per rank; the reference is the whole
 * copy clipped in one process. */
static void test_clip(int trials) {
  bx_comm comm = bx_comm_mpi(MPI_COMM_WORLD);
  for (int t = 0; t < trials; t++) {
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.scale.mode = t % 2 ? BX_SCALE_EXACT : BX_SCALE_TORCH;
    co.formula = t % 3 == 2 ? BX_COEF_MAX : BX_COEF_TORCH;
    double max_norm = t % 4 == 3 ? 0.0 : 0.05 * (1 + t % 3);
    tensor refm[NT];
    for (int i = 0; i < NT; i++) {
      refm[i] = model[i];
      refm[i].data = malloc(model[i].n * model[i].esize + 1);
      memcpy(refm[i].data, model[i].data, model[i].n * model[i].esize);
    }
    owned whole, mine;
    owned_init(&whole, NT);
    owned_init(&mine, 5 * NT);
    owned_reset(&whole);
    for (int i = 0; i < NT; i++) owned_add(&whole, &refm[i], 0, refm[i].n);
    double ref_norm, ref_coef;
    bx_status st = bx_clip_grad_norm(owned_groups(&whole, NGROUPS), NGROUPS, NULL, max_norm, &co,
                                     &ref_norm, &ref_coef);
    CHECK(st == BX_OK, "reference clip: %s", bx_last_error());

    /* this rank's copy, of which it clips only what it owns */
    tensor copy[NT];
    for (int i = 0; i < NT; i++) {
      copy[i] = model[i];
      copy[i].data = malloc(model[i].n * model[i].esize + 1);
      memcpy(copy[i].data, model[i].data, model[i].n * model[i].esize);
    }
    tensor saved[NT];
    memcpy(saved, model, sizeof saved);
    memcpy(model, copy, sizeof model); /* partition() reads `model` */
    partition(&mine, 50 + t);
    memcpy(model, saved, sizeof model);
    double norm = -1, coef = -1;
    st = bx_clip_grad_norm(owned_groups(&mine, NGROUPS), NGROUPS, &comm, max_norm, &co, &norm,
                           &coef);
    CHECK(st == BX_OK, "clip trial %d: %s", t, bx_last_error());
    CHECK(same_bits(norm, ref_norm), "clip trial %d: norm %a != %a", t, norm, ref_norm);
    CHECK(same_bits(coef, ref_coef), "clip trial %d: coef %a != %a", t, coef, ref_coef);
    /* owned pieces equal the reference; everything else untouched */
    for (int g = 0; g < NGROUPS; g++)
      for (size_t k = 0; k < mine.count[g]; k++) {
        const DLTensor *v = &mine.views[g][k];
        for (int i = 0; i < NT; i++) {
          char *base = copy[i].data;
          size_t bytes = copy[i].n * copy[i].esize;
          if ((char *)v->data >= base && (char *)v->data < base + bytes) {
            size_t off = (size_t)((char *)v->data - base);
            size_t len = (size_t)v->shape[0] * copy[i].esize;
            CHECK(memcmp((char *)refm[i].data + off, v->data, len) == 0,
                  "clip trial %d: tensor %d bytes [%zu,+%zu) differ from the single-process "
                  "clip", t, i, off, len);
            /* mark as checked by restoring the original for the next test */
            memcpy((char *)copy[i].data + off, (char *)model[i].data + off, len);
          }
        }
      }
    for (int i = 0; i < NT; i++)
      CHECK(memcmp(copy[i].data, model[i].data, copy[i].n * copy[i].esize) == 0,
            "clip trial %d: tensor %d modified outside the rank's own pieces", t, i);
    for (int i = 0; i < NT; i++) {
      free(copy[i].data);
      free(refm[i].data);
    }
    owned_free(&whole);
    owned_free(&mine);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int trials = argc > 1 ? atoi(argv[1]) : 12;
  make_model(20261129);
  test_norms(trials);
  test_clip(trials);
  int bad = dist_finish("test_partition");
  for (int i = 0; i < NT; i++) free(model[i].data);
  MPI_Finalize();
  return bad;
}
