/*
 * rope_hd.h — the arithmetic of bx_rope_forward/_backward/_cos_sin
 * (src/train/rope.c; bitexact_train.h states it), once for the CPU and the
 * GPU (BX_HD): the inverse frequencies (fp32 exponent, bx_pow_det, fp32
 * reciprocal), the angle of a (token, frequency), its cosine and signed
 * sine, and the rotation of one (a, b) pair. `a*c - b*s` is two roundings
 * of products and one of the difference: --fmad=false / -ffp-contract=off
 * keep the compilers from fusing it (nvcc's default would).
 */
#ifndef BX_ROPE_HD_H
#define BX_ROPE_HD_H

#include <stdint.h>

#include "hd.h"
#include "math_det.h"
#include "nan_canon.h"
#include "pow_det.h"

/* inv[i] = fl(1 / fl(b^fl(2i / rotary_dim))), i < rotary_dim / 2 <= 2^23 */
static inline BX_HD float bx_rope_inv_freq_f32(uint64_t i, uint64_t rotary_dim, float base) {
  float ex = (float)(2 * i) / (float)rotary_dim;
  float p = (float)bx_pow_det((double)base, (double)ex);
  return 1.0f / p;
}

/* The angle of a position (0 <= pos <= 2^24: exact in fp32) and frequency. */
static inline BX_HD float bx_rope_angle_f32(int64_t pos, float inv) { return (float)pos * inv; }

/* cos and sin_sign * sin of an angle (sin_sign +1 forward, -1 backward:
 * fl(b * -s) = -fl(b * s), so the backward is the transposed rotation). */
static inline BX_HD void bx_rope_cos_sin_f32(float ang, float sin_sign, float *c, float *s) {
  *c = bx_cosf_det(ang);
  *s = sin_sign * bx_sinf_det(ang);
}

/* The rotated pair: ya = a*c - b*s, yb = b*c + a*s (NaN-canonical). */
static inline BX_HD void bx_rope_pair_f32(float a, float b, float c, float s, float *ya,
                                          float *yb) {
  float ra = a * c - b * s, rb = b * c + a * s;
  *ya = bx_canon_f32(ra);
  *yb = bx_canon_f32(rb);
}

#endif /* BX_ROPE_HD_H */
