/* simple.c — the README's example: the exact global norm of two fp32
 * gradients, then torch-style clipping to max_norm = 1. */
#include <stdio.h>

#include <bitexact.h>

int main(void) {
  float w[4] = {0.5f, -1.5f, 2.0f, 0.25f}; /* gradient of a weight */
  float b[2] = {1.0f, -0.75f};             /* gradient of a bias   */
  int64_t w_shape[1] = {4}, b_shape[1] = {2};
  DLTensor grads[2] = {
      {.data = w, .device = {kDLCPU, 0}, .ndim = 1,
       .dtype = {kDLFloat, 32, 1}, .shape = w_shape},
      {.data = b, .device = {kDLCPU, 0}, .ndim = 1,
       .dtype = {kDLFloat, 32, 1}, .shape = b_shape},
  };
  bx_group all = {grads, 2};

  double norm, coef;
  bx_status st = bx_clip_grad_norm(&all, 1, NULL, /*max_norm=*/1.0, NULL,
                                   &norm, &coef);
  if (st != BX_OK) {
    fprintf(stderr, "%s: %s\n", bx_status_str(st), bx_last_error());
    return 1;
  }
  printf("norm %.17g  coef %.17g  w[0] now %.9g\n", norm, coef, w[0]);
  return 0;
}
