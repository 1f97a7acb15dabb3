/*
 * rope.c — bx_rope_forward / bx_rope_backward / bx_rope_cos_sin
 * (bitexact_train.h, "Layers"): transformers' rotate_half RoPE with
 * partial rotary on fp32 token-major q or k. The inverse frequencies are
 * formed once per call (fp32 exponent, bx_pow_det, fp32 reciprocal), the
 * angle of each (token, frequency) once per token and shared by all heads.
 * The backward is the forward with the sine negated: fl(b * -s) = -fl(b * s)
 * and a - (-b) = a + b in IEEE arithmetic, so it is bit for bit the
 * transposed rotation the header states. Threads take whole tokens.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "train_check.h"
#include "train_device.h"
#include "pool.h"
#include "rope_hd.h"
#include "workspace.h"

#define MAX_POSITION ((int64_t)1 << 24) /* exact in fp32 */

/* inv[i] for i < rotary_dim / 2 (rope_hd.h) */
static void inv_freq(size_t rotary_dim, float base, float *inv) {
  for (size_t i = 0; i < rotary_dim / 2; i++)
    inv[i] = bx_rope_inv_freq_f32((uint64_t)i, (uint64_t)rotary_dim, base);
}

typedef struct rope_job {
  const float *x;
  float *y;
  const int64_t *pos;
  const float *inv;
  size_t tokens, width, head_dim, heads, half, piece;
  float sin_sign;       /* +1 forward, -1 backward */
  float *cos, *sin;     /* bx_rope_cos_sin: [tokens, half] outputs */
} rope_job;

static void rope_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const rope_job *j = ctx;
  size_t t0 = task * j->piece, t1 = j->tokens - t0 < j->piece ? j->tokens : t0 + j->piece;
  for (size_t t = t0; t < t1; t++) {
    const float *x = j->x + t * j->width;
    float *y = j->y + t * j->width;
    for (size_t i = 0; i < j->half; i++) {
      float c, s;
      bx_rope_cos_sin_f32(bx_rope_angle_f32(j->pos[t], j->inv[i]), j->sin_sign, &c, &s);
      for (size_t h = 0; h < j->heads; h++) {
        size_t o = h * j->head_dim + i;
        bx_rope_pair_f32(x[o], x[o + j->half], c, s, &y[o], &y[o + j->half]);
      }
    }
    if (x != y)
      for (size_t h = 0; h < j->heads; h++) {
        size_t o = h * j->head_dim + 2 * j->half;
        memcpy(y + o, x + o, (j->head_dim - 2 * j->half) * sizeof(float));
      }
  }
}

static void table_piece(void *ctx, size_t task, int worker) {
  (void)worker;
  const rope_job *j = ctx;
  size_t t0 = task * j->piece, t1 = j->tokens - t0 < j->piece ? j->tokens : t0 + j->piece;
  for (size_t t = t0; t < t1; t++) {
    for (size_t i = 0; i < j->half; i++)
      bx_rope_cos_sin_f32(bx_rope_angle_f32(j->pos[t], j->inv[i]), 1.0f,
                          &j->cos[t * j->half + i], &j->sin[t * j->half + i]);
  }
}

/* struct_size (first), num_threads, then the call is entered */
static bx_status enter(bx_call *c, const char *fn, const bx_rope_opts *opts, int *threads) {
  return bx_tc_enter(c, fn, opts, sizeof *opts, offsetof(bx_rope_opts, num_threads),
                     "bx_rope_opts", "BX_ROPE_OPTS_DEFAULT", threads);
}

/* rotary_dim, theta; head_dim when has_head (the table call has none) */
static bx_status check_params(const char *fn, int has_head, int64_t head_dim, int64_t rotary_dim,
                              double theta) {
  if (has_head && (head_dim < 2 || head_dim > MAX_POSITION))
    return bx_fail(BX_EINVAL, "%s: head_dim %lld is not in [2, 2^24]", fn, (long long)head_dim);
  if (rotary_dim < 2 || rotary_dim % 2 || rotary_dim > MAX_POSITION)
    return bx_fail(BX_EINVAL, "%s: rotary_dim %lld is not an even number in [2, 2^24]", fn,
                   (long long)rotary_dim);
  if (has_head && rotary_dim > head_dim)
    return bx_fail(BX_EINVAL, "%s: rotary_dim %lld exceeds head_dim %lld", fn,
                   (long long)rotary_dim, (long long)head_dim);
  if (!(theta >= 1.0 && theta <= 0x1.fffffep127))
    return bx_fail(BX_EINVAL, "%s: theta %g is below 1, NaN or not finite in fp32", fn, theta);
  return BX_OK;
}

/* every position in [0, 2^24]; only read */
static bx_status check_positions(const char *fn, const bx_tc_tensor *p) {
  const int64_t *v = p->data;
  for (size_t t = 0; t < p->n; t++)
    if (v[t] < 0 || v[t] > MAX_POSITION)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, p->index,
                        "%s: tensor %zu (%s): element %zu is %lld, outside [0, 2^24]", fn,
                        p->index, p->name, t, (long long)v[t]);
  return BX_OK;
}

/* The CUDA path: the positions copied to the host and checked there (an
 * error names the element, as on the host path), then the device's
 * kernel (every inverse frequency, angle and rotation by rope_hd.h). */
static bx_status rope_cuda(const char *fn, const bx_tc_place *pl, const bx_tc_tensor *pos,
                           const float *x, float *y, size_t tokens, size_t width,
                           size_t head_dim, size_t rotary_dim, float theta, float sin_sign) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st != BX_OK || !tokens || !width) return st;
  int64_t *host = bx_workspace(tokens * sizeof(int64_t));
  if (!host) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu positions on the host", fn, tokens);
  st = dev->to_host(fn, pl->device, host, pos->data, tokens * sizeof(int64_t));
  if (st != BX_OK) return st;
  bx_tc_tensor hp = *pos;
  hp.data = host;
  st = check_positions(fn, &hp);
  if (st != BX_OK) return st;
  return dev->rope(fn, pl->device, x, y, pos->data, tokens, width, head_dim, rotary_dim / 2,
                   rotary_dim, theta, sin_sign);
}

static bx_status rope_run(const char *fn, const char *xname, const char *yname,
                          const DLTensor *x, const DLTensor *positions, int64_t head_dim,
                          int64_t rotary_dim, double theta, DLTensor *y, float sin_sign,
                          const bx_rope_opts *opts) {
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor a[3];
  size_t tokens = 0, width = 0;
  const DLTensor *ts[3] = {x, positions, y};
  const bx_tc_place pl = bx_tc_place_of(ts, 3);
  st = check_params(fn, 1, head_dim, rotary_dim, theta);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 0, xname, x, BX_TC_F32, 2, 3, NULL, 0, &a[0]);
  if (st == BX_OK)
    st = bx_tc_check_in(&pl, fn, 1, "positions", positions, BX_TC_I64, 1, 2, NULL, 0, &a[1]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 2, yname, y, BX_TC_F32, 2, 3, NULL, 1, &a[2]);
  if (st == BX_OK) {
    /* T tokens of width = n / T features, token-major: [T, W], [B, L, W]
     * (rows == T), or [T, heads, head_dim] (shape[0] == T) */
    tokens = a[1].n;
    size_t hd = (size_t)head_dim;
    width = tokens ? a[0].n / tokens : 0;
    int ok = tokens ? a[0].n % tokens == 0 && width % hd == 0 &&
                          (a[0].rows == tokens || (a[0].ndim == 3 && a[0].cols == hd &&
                                                   (size_t)x->shape[0] == tokens))
                    : a[0].n == 0;
    if (!ok)
      st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 0,
                      "%s: tensor 0 (%s) is not %zu tokens (one per position) of heads * "
                      "head_dim (%lld) features: want [T, heads*head_dim], [B, L, "
                      "heads*head_dim] or [T, heads, head_dim]", fn, xname, tokens,
                      (long long)head_dim);
  }
  if (st == BX_OK && !bx_tc_same_shape(&a[0], &a[2]))
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, 2, "%s: tensor 2 (%s): shape differs from "
                    "tensor 0's (%s)", fn, yname, xname);
  if (st == BX_OK) {
    a[2].inplace = 0; /* y may be x exactly */
    const bx_tc_tensor *all[3] = {&a[0], &a[1], &a[2]};
    st = bx_tc_overlap(fn, all, 3);
  }
  if (st == BX_OK && pl.cuda) {
    st = rope_cuda(fn, &pl, &a[1], a[0].data, a[2].data, tokens, width, (size_t)head_dim,
                   (size_t)rotary_dim, (float)theta, sin_sign);
    goto done;
  }
  if (st == BX_OK) st = check_positions(fn, &a[1]);
  float *inv = NULL;
  if (st == BX_OK && tokens) {
    inv = bx_workspace((size_t)rotary_dim / 2 * sizeof(float));
    if (!inv) st = bx_fail(BX_ENOMEM, "%s: cannot allocate %lld floats of workspace", fn,
                           (long long)rotary_dim / 2);
  }
  if (st != BX_OK || !tokens) goto done;
  inv_freq((size_t)rotary_dim, (float)theta, inv);
  rope_job j;
  memset(&j, 0, sizeof j);
  j.x = a[0].data;
  j.y = a[2].data;
  j.pos = a[1].data;
  j.inv = inv;
  j.tokens = tokens;
  j.width = width;
  j.head_dim = (size_t)head_dim;
  j.heads = width / j.head_dim;
  j.half = (size_t)rotary_dim / 2;
  j.piece = bx_tc_piece_rows(width ? width : 1);
  j.sin_sign = sin_sign;
  if (width) bx_tc_run(threads, (tokens + j.piece - 1) / j.piece, rope_piece, &j);
done:
  bx_call_leave(&c);
  return st;
}

bx_status bx_rope_forward(const DLTensor *x, const DLTensor *positions, int64_t head_dim,
                          int64_t rotary_dim, double theta, DLTensor *y,
                          const bx_rope_opts *opts) {
  return rope_run("bx_rope_forward", "x", "y", x, positions, head_dim, rotary_dim, theta, y,
                  1.0f, opts);
}

bx_status bx_rope_backward(const DLTensor *dy, const DLTensor *positions, int64_t head_dim,
                           int64_t rotary_dim, double theta, DLTensor *dx,
                           const bx_rope_opts *opts) {
  return rope_run("bx_rope_backward", "dy", "dx", dy, positions, head_dim, rotary_dim, theta, dx,
                  -1.0f, opts);
}

/* bx_rope_cos_sin's CUDA path: the positions copied to the host and
 * checked there (the host path's errors, nothing written), then the
 * device's table kernel (rope_hd.h's inverse frequency, angle, cos and sin
 * per (token, slot)). */
static bx_status table_cuda(const char *fn, const bx_tc_place *pl, const bx_tc_tensor *pos,
                            float *cos, float *sin, size_t half, float theta) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st != BX_OK || !pos->n) return st;
  bx_tc_tensor hp;
  const bx_tc_tensor *ts[1] = {pos};
  st = bx_tc_to_host(fn, pl, dev, ts, &hp, 1, 0, NULL);
  if (st == BX_OK) st = check_positions(fn, &hp);
  if (st == BX_OK) st = dev->rope_table(fn, pl->device, pos->data, cos, sin, pos->n, half, theta);
  return st;
}

bx_status bx_rope_cos_sin(const DLTensor *positions, int64_t rotary_dim, double theta,
                          DLTensor *cos, DLTensor *sin, const bx_rope_opts *opts) {
  static const char *fn = "bx_rope_cos_sin";
  int threads;
  bx_call c;
  bx_status st = enter(&c, fn, opts, &threads);
  if (st != BX_OK) return st;
  bx_tc_tensor a[3];
  size_t half = (size_t)(rotary_dim / 2);
  const DLTensor *ts[3] = {positions, cos, sin};
  const bx_tc_place pl = bx_tc_place_of(ts, 3);
  st = check_params(fn, 0, 0, rotary_dim, theta);
  if (st == BX_OK)
    st = bx_tc_check_in(&pl, fn, 0, "positions", positions, BX_TC_I64, 1, 2, NULL, 0, &a[0]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 1, "cos", cos, BX_TC_F32, 1, 3, NULL, 1, &a[1]);
  if (st == BX_OK) st = bx_tc_check_in(&pl, fn, 2, "sin", sin, BX_TC_F32, 1, 3, NULL, 1, &a[2]);
  if (st == BX_OK) st = bx_tc_shape(fn, &a[1], a[0].n, half, "[T, rotary_dim / 2] =");
  if (st == BX_OK) st = bx_tc_shape(fn, &a[2], a[0].n, half, "[T, rotary_dim / 2] =");
  if (st == BX_OK) {
    const bx_tc_tensor *all[3] = {&a[0], &a[1], &a[2]};
    st = bx_tc_overlap(fn, all, 3);
  }
  if (st == BX_OK && pl.cuda) {
    st = table_cuda(fn, &pl, &a[0], a[1].data, a[2].data, half, (float)theta);
    goto done;
  }
  if (st == BX_OK) st = check_positions(fn, &a[0]);
  float *inv = NULL;
  if (st == BX_OK && a[0].n) {
    inv = bx_workspace(half * sizeof(float));
    if (!inv) st = bx_fail(BX_ENOMEM, "%s: cannot allocate %zu floats of workspace", fn, half);
  }
  if (st != BX_OK || !a[0].n) goto done;
  inv_freq((size_t)rotary_dim, (float)theta, inv);
  rope_job j;
  memset(&j, 0, sizeof j);
  j.pos = a[0].data;
  j.inv = inv;
  j.tokens = a[0].n;
  j.half = half;
  j.piece = bx_tc_piece_rows(half);
  j.cos = a[1].data;
  j.sin = a[2].data;
  bx_tc_run(threads, (j.tokens + j.piece - 1) / j.piece, table_piece, &j);
done:
  bx_call_leave(&c);
  return st;
}
