/*
 * test_attention_tiles.c — bx_attention_forward / bx_attention_backward at
 * the edges of their micro-kernel tiling (src/train/attention.c,
 * attention_bwd.c): shapes around the tiles and row blocks, and inputs on
 * which a lane computed at the causal diagonal but not to be kept would
 * change a bit (docs/train_attention.md, "Threads and invariance").
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_prob.h"
#include "tests.h"

/* The tiling's edges: L around and across the micro-kernels' mr (4, 6, 12)
 * and nr (8, 16, 32) and the backward's row blocks (64 to 72 positions), D
 * of 1, 3, 17 and 130 (one lane, odd, one past a sliver, a partial last
 * sliver), GQA groups of 1, 2, 4; on every ISA and at 1..3 threads, bit for
 * bit against the documented order (and within the fp64 bound). */
void test_attention_tiling_edges(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const size_t Ls[] = {1, 2, 5, 11, 12, 13, 31, 33, 63, 64, 65, 71, 72, 73, 137, 150};
  static const size_t Ds[] = {1, 3, 17, 130};
  static const size_t Rs[] = {1, 2, 4};
  int n = 0;
  for (size_t li = 0; li < sizeof Ls / sizeof Ls[0] && !bxt_failures(); li++)
    for (size_t di = 0; di < 4 && !bxt_failures(); di++, n++) {
      size_t L = Ls[li], D = Ds[di], R = Rs[(li + di) % 3], Hkv = 1 + (size_t)(n % 2);
      if (L > 100 && D == 130 && R == 4) R = 2; /* keeps the suite quick */
      size_t B = L > 100 ? 1 : 1 + (size_t)(n % 3);
      aprob a;
      ap_make(&a, B, L, Hkv * R, Hkv, D);
      ap_fill(&r, &a, n % 4 == 3 ? 6.0 : 1.0);
      int isa = n % bxt_isa_count();
      if (!bxt_force(isa)) isa = -1;
      char what[160];
      snprintf(what, sizeof what, "seed %llu isa %s B %zu L %zu Hq %zu Hkv %zu D %zu",
               (unsigned long long)bxt_seed(), isa < 0 ? "auto" : bxt_isa(isa), B, L, Hkv * R, Hkv, D);
      CHECK_STATUS(ap_fwd(&a, 1 + n % 3), BX_OK, "%s forward", what);
      CHECK_STATUS(ap_bwd(&a, 1 + n % 3), BX_OK, "%s backward", what);
      check_problem(&a, what);
      ap_free(&a);
    }
  bxt_force(-1);
}

/* bits of the documented order, a NaN of any payload standing for a NaN */
static void same_chain_nan(aprob *a, const char *what) {
  float *o = malloc((a->nq + 1) * 4), *st = malloc((a->nst + 1) * 4), *dq = malloc((a->nq + 1) * 4),
        *dk = malloc((a->nk + 1) * 4), *dv = malloc((a->nk + 1) * 4);
  achain_forward(&a->s, a->q, a->k, a->v, o, st);
  achain_backward(&a->s, a->dout, a->q, a->k, a->v, a->stats, dq, dk, dv);
  const float *got[4] = {a->o, a->dq, a->dk, a->dv}, *want[4] = {o, dq, dk, dv};
  size_t n[4] = {a->nq, a->nq, a->nk, a->nk};
  static const char *nm[4] = {"o", "dq", "dk", "dv"};
  for (int t = 0; t < 4; t++)
    for (size_t i = 0; i < n[t]; i++) {
      float x = got[t][i], y = want[t][i];
      if (!CHECK(isnan(y) ? isnan(x) : bxt_fbits(x) == bxt_fbits(y),
                 "%s: %s[%zu] = %a (0x%08x), the documented order %a (0x%08x)", what, nm[t], i,
                 (double)x, (unsigned)bxt_fbits(x), (double)y, (unsigned)bxt_fbits(y)))
        break;
    }
  free(o);
  free(st);
  free(dq);
  free(dk);
  free(dv);
}

/* The diagonal's lanes that a tile computes but must not keep: an Inf in q,
 * dout, k or v of one row makes NaN in lanes of other rows, and magnitudes
 * so small that the o, dk chains reach -0 (which an added fma(+0, x, -0)
 * would turn to +0); either would show if such a lane leaked into a kept
 * value. Every ISA, several rows of the diagonal slivers. */
void test_attention_tiling_lanes(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  int n = 0;
  for (int isa = 0; isa < bxt_isa_count(); isa++) {
    if (!bxt_force(isa)) continue;
    for (int kind = 0; kind < 4 && !bxt_failures(); kind++, n++) {
      size_t L = kind >= 2 ? 150 : 40 + (size_t)n, R = 1 + (size_t)(n % 2), D = kind ? 17 : 5;
      aprob a;
      ap_make(&a, kind < 2 ? 6 : 1, L, 2 * R, 2, D);
      ap_fill(&r, &a, 1.0);
      if (kind < 2) { /* an Inf in q, dout, k or v, one sequence each (else one would hide another) */
        a.k[AIX(4 * L + 9 + (size_t)n, 1, (size_t)n % D, 2, D)] = INFINITY;
        a.v[AIX(5 * L + 7 + (size_t)n, 0, (size_t)n % D, 2, D)] = -INFINITY;
        for (size_t b = 0; b < 4; b++) {
          size_t i = b < 2 ? 1 + (size_t)n : 14 + 3 * (size_t)n, h = b % 3 ? 2 * R - 1 : 0;
          float *x = b % 2 ? a.dout : a.q;
          x[AIX(b * L + i, h, (size_t)n % D, 2 * R, D)] = b % 2 ? -INFINITY : INFINITY;
        }
      } else if (kind == 2) { /* tiny q and dout: gs q and p dout underflow, signed zeros */
        for (size_t i = 0; i < a.nq; i++) {
          a.q[i] *= 0x1p-70f;
          a.dout[i] *= 0x1p-140f;
        }
      } else { /* tiny v: p v underflows, signed zeros in o */
        for (size_t i = 0; i < a.nk; i++) a.v[i] *= 0x1p-140f;
      }
      char what[160];
      snprintf(what, sizeof what, "seed %llu isa %s kind %d L %zu R %zu D %zu",
               (unsigned long long)bxt_seed(), bxt_isa(isa), kind, L, R, D);
      CHECK_STATUS(ap_fwd(&a, 2), BX_OK, "%s forward", what);
      CHECK_STATUS(ap_bwd(&a, 2), BX_OK, "%s backward", what);
      same_chain_nan(&a, what);
      if (kind >= 2) {
        const float *x = kind == 2 ? a.dk : a.o;
        size_t negz = 0, nx = kind == 2 ? a.nk : a.nq;
        for (size_t i = 0; i < nx; i++) negz += bxt_fbits(x[i]) == 0x80000000u;
        CHECK(negz > 0, "%s: the tiny case should give some -0 in %s", what, kind == 2 ? "dk" : "o");
      }
      ap_free(&a);
    }
  }
  bxt_force(-1);
}
