/*
 * portable_scale.c — the reference scaling kernels, plain C (see
 * bx_scale_mode in bitexact.h for the two roundings). The per-element
 * arithmetic lives in src/common/scale_round.h, shared with the CUDA kernel.
 */
#include "kernels.h"
#include "scale_round.h"

/* ---- per-dtype kernels over one span (bx_scale_fn signature) -------- */

static void scale_f32_torch(void *xv, size_t n, double coef) {
  float *x = xv, c = (float)coef;
  for (size_t i = 0; i < n; i++) x[i] = bx_scale_f32_torch_one(x[i], c);
}
static void scale_f32_exact(void *xv, size_t n, double coef) {
  float *x = xv;
  bx_split_coef k = bx_split(coef);
  for (size_t i = 0; i < n; i++) x[i] = bx_scale_f32_exact_one(x[i], &k);
}
/* fp64: g * coef rounded once in both modes */
static void scale_f64(void *xv, size_t n, double c) {
  double *x = xv;
  for (size_t i = 0; i < n; i++) x[i] = bx_scale_f64_one(x[i], c);
}
static void scale_bf16_torch(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  float c = (float)coef;
  for (size_t i = 0; i < n; i++) x[i] = bx_scale_bf16_torch_one(x[i], c);
}
static void scale_bf16_exact(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  bx_split_coef k = bx_split(coef);
  for (size_t i = 0; i < n; i++) x[i] = bx_scale_bf16_exact_one(x[i], &k);
}
static void scale_f16_torch(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  float c = (float)coef;
  for (size_t i = 0; i < n; i++) x[i] = bx_scale_f16_torch_one(x[i], c);
}
static void scale_f16_exact(void *xv, size_t n, double coef) {
  uint16_t *x = xv;
  bx_split_coef k = bx_split(coef);
  for (size_t i = 0; i < n; i++) x[i] = bx_scale_f16_exact_one(x[i], &k);
}

const bx_scale_kernels bx_scale_portable = {
    "portable",
    {scale_f16_torch, scale_bf16_torch, scale_f32_torch, scale_f64},
    {scale_f16_exact, scale_bf16_exact, scale_f32_exact, scale_f64},
};
