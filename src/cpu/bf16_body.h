/*
 * bf16_body.h — fp32 -> bf16 rounding (bx_round_bf16, the bf16 GEMM
 * operands of the model, src/glm): nearest even on the bits, every NaN the
 * canonical 0x7FC0 (nan_canon.h), subnormals and overflow as IEEE rounding
 * gives them (integer operations only). Written once and included by
 * portable_math.c and, through vmath_body.h, by avx2_math.c /
 * avx512_math.c, whose flags let the compiler vectorise the loop 8 or 16
 * lanes wide: the same bits on every ISA. Not a header of its own: it
 * defines one static function.
 */
#include <stddef.h>
#include <stdint.h>

/* GCC's -O2 cost model declines the loop; ask for it. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#endif
static void bf16_round_loop(const float *restrict x, uint16_t *restrict y, size_t n) {
  const uint32_t *u = (const uint32_t *)(const void *)x;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = u[i];
    uint32_t nan = (uint32_t)-(int32_t)((v & 0x7fffffffu) > 0x7f800000u); /* all ones: NaN */
    uint32_t r = (v + 0x7fffu + ((v >> 16) & 1u)) >> 16;
    y[i] = (uint16_t)((r & ~nan) | (0x7FC0u & nan)); /* BX_BF16_CANON_NAN */
  }
}
