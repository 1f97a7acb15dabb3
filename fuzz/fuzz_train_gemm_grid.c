/*
 * fuzz_train_gemm_grid.c — the CUDA GEMM's decomposition (issue 30, S2;
 * src/cuda/train/train_grid.h: 64 x 64 tiles, 4 x 4 outputs per thread,
 * k through shared memory 16 at a time, edge tiles) run on the CPU against
 * bx_gemm, bit for bit, under every ISA this CPU runs.
 *
 * Input: byte 0 layout (0..2) and flags (bf16 a, bf16 b, accumulate);
 * bytes 1..3 m, n, k - 1 (each 1..80 / 1..80 / 1..64 from a byte); then
 * element bits, 4 bytes each (bf16 operands: the high half), repeated
 * cyclically; the block and thread order from the input too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "fuzz_common.h"
#include "../src/cuda/train/train_grid.h"

static uint32_t fz_word(const uint8_t *d, size_t n, size_t i) {
  uint32_t w = 0;
  for (int b = 0; b < 4; b++) w = w << 8 | d[(i * 4 + (size_t)b) % n];
  return w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8) return 0;
  fz_init_isas();
  int layout = data[0] % 3, abf = data[0] >> 2 & 1, bbf = data[0] >> 3 & 1, acc = data[0] >> 4 & 1;
  size_t m = 1 + data[1] % 80, n = 1 + data[2] % 80, k = data[3] % 65;
  const uint8_t *el = data + 4;
  size_t nel = size - 4, w = 0;
  float *af = malloc(m * k * 4 + 4), *bf = malloc(n * k * 4 + 4), *c0 = malloc(m * n * 4);
  uint16_t *ah = malloc(m * k * 2 + 2), *bh = malloc(n * k * 2 + 2);
  for (size_t i = 0; i < m * k; i++) {
    uint32_t u = fz_word(el, nel, w++);
    af[i] = bx_f32_from_bits(u);
    ah[i] = (uint16_t)(u >> 16);
  }
  for (size_t i = 0; i < n * k; i++) {
    uint32_t u = fz_word(el, nel, w++);
    bf[i] = bx_f32_from_bits(u);
    bh[i] = (uint16_t)(u >> 16);
  }
  for (size_t i = 0; i < m * n; i++) c0[i] = bx_f32_from_bits(fz_word(el, nel, w++));
  const void *a = abf ? (const void *)ah : (const void *)af, *b = bbf ? (const void *)bh : (const void *)bf;
  float *c_sim = malloc(m * n * 4), *c_cpu = malloc(m * n * 4);
  memcpy(c_sim, c0, m * n * 4);
  bx_tg_gemm g = {a, b, abf, bbf, layout, c_sim, m, n, k, acc};
  if (!(k == 0 && acc)) {
    uint32_t gx = (uint32_t)((m + 63) / 64), gy = (uint32_t)((n + 63) / 64), nb = gx * gy;
    static float accs[BX_TG_GEMM_THREADS][BX_TG_GEMM_TM * BX_TG_GEMM_TN];
    float As[BX_TG_GEMM_BK * BX_TG_GEMM_BM], Bs[BX_TG_GEMM_BK * BX_TG_GEMM_BN];
    for (uint32_t bi = 0; bi < nb; bi++) {
      uint32_t blk = (bi + data[4]) % nb; /* a rotation of the block order */
      uint64_t bm = blk % gx, bn = blk / gx;
      uint32_t step = 2 * (data[5] % 128) + 1, off = data[6]; /* an odd stride: a permutation */
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) {
        uint32_t tid = (t * step + off) % BX_TG_GEMM_THREADS;
        bx_tg_gemm_init(&g, bm, bn, tid, accs[tid]);
      }
      for (uint64_t k0 = 0; k0 < k; k0 += BX_TG_GEMM_BK) {
        for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++)
          bx_tg_gemm_load(&g, bm, bn, k0, (t * step + off) % BX_TG_GEMM_THREADS, As, Bs);
        for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++) {
          uint32_t tid = (t * step + off + 7) % BX_TG_GEMM_THREADS;
          bx_tg_gemm_compute(&g, k0, tid, As, Bs, accs[tid]);
        }
      }
      for (uint32_t t = 0; t < BX_TG_GEMM_THREADS; t++)
        bx_tg_gemm_store(&g, bm, bn, t, accs[t]);
    }
  }
  int64_t sa[2], sb[2], sc[2] = {(int64_t)m, (int64_t)n};
  if (layout == 2) { sa[0] = (int64_t)k; sa[1] = (int64_t)m; }
  else { sa[0] = (int64_t)m; sa[1] = (int64_t)k; }
  if (layout == 0) { sb[0] = (int64_t)n; sb[1] = (int64_t)k; }
  else { sb[0] = (int64_t)k; sb[1] = (int64_t)n; }
  DLTensor ta, tb, tc;
  memset(&ta, 0, sizeof ta);
  ta.device.device_type = kDLCPU;
  ta.ndim = 2;
  tb = tc = ta;
  ta.data = (void *)a, ta.shape = sa, ta.dtype.code = abf ? kDLBfloat : kDLFloat;
  ta.dtype.bits = abf ? 16 : 32, ta.dtype.lanes = 1;
  tb.data = (void *)b, tb.shape = sb, tb.dtype.code = bbf ? kDLBfloat : kDLFloat;
  tb.dtype.bits = bbf ? 16 : 32, tb.dtype.lanes = 1;
  tc.data = c_cpu, tc.shape = sc, tc.dtype.code = kDLFloat, tc.dtype.bits = 32, tc.dtype.lanes = 1;
  bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
  o.accumulate = acc;
  for (int s = 0; s < fz_nisas; s++) {
    bx_force_isa(fz_isas[s]);
    memcpy(c_cpu, c0, m * n * 4);
    if (bx_gemm(&ta, &tb, (bx_gemm_layout)layout, &tc, &o) != BX_OK) FZ_FAIL("bx_gemm failed");
    for (size_t i = 0; i < m * n; i++)
      if (bx_f32_bits(c_cpu[i]) != bx_f32_bits(c_sim[i]))
        FZ_FAIL("gemm grid layout %d m %zu n %zu k %zu bf16 %d/%d acc %d isa %s: element %zu "
                "sim 0x%08x CPU 0x%08x", layout, m, n, k, abf, bbf, acc, fz_isas[s], i,
                bx_f32_bits(c_sim[i]), bx_f32_bits(c_cpu[i]));
  }
  bx_force_isa(NULL);
  free(af), free(bf), free(c0), free(ah), free(bh), free(c_sim), free(c_cpu);
  return 0;
}
