/*
 * tokred.c — the layout-invariant token reduction (bitexact_train.h,
 * "Token reduction"; DESIGN §9 point 2): canonical chunk addends rounded
 * onto a per-tensor int64 grid whose exponent is agreed over ranks, summed
 * as int64 words in any order, rounded once. The grid's numerics live in
 * src/common/tokred_grid.h; this file holds the state, the checks, the
 * kernels over one partial and the finish. The collectives (agreement,
 * all-reduce) are in tokred_comm.c, the state and its words in
 * tokred_internal.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "bitexact_train.h"
#include "call.h"
#include "error.h"
#include "kernels.h"
#include "tensor.h"
#include "tokred_grid.h"
#include "tokred_internal.h"
#include "train_check.h"
#include "train_device.h"
#include "workspace.h"

/* The per-element loops below are exact integer and exactly-rounded
 * elementwise operations (no float reduction), so vectorising them cannot
 * change a bit. GCC's -O2 cost model declines them; ask for it. */
#if defined(__GNUC__) && !defined(__clang__)
#define BX_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define BX_VECTORIZE
#endif

/* ---- small checks ------------------------------------------------------ */

static int host_readable(DLDeviceType dev) {
  return dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged || dev == kDLROCMHost;
}

static int is_f32(DLDataType dt) { return dt.code == kDLFloat && dt.bits == 32 && dt.lanes == 1; }
static int is_f64(DLDataType dt) { return dt.code == kDLFloat && dt.bits == 64 && dt.lanes == 1; }

static bx_status check_opts_size(const char *fn, const bx_tokred_opts *o) {
  if (!o) return BX_OK;
  return bx_check_struct_size(fn, "opts->struct_size", o->struct_size, sizeof *o,
                              "bx_tokred_opts", "BX_TOKRED_OPTS_DEFAULT");
}

/* What check_like accepts beyond a host fp32 tensor. */
enum { LIKE_F32 = 0, LIKE_F64 = 1 /* an output: fp64 too */, LIKE_CUDA = 2 /* a partial: kDLCUDA too */ };
/* (bit flags: an output on a CUDA device is LIKE_F64 | LIKE_CUDA) */

/* A partial or an output against tensor t of s: host (or a kDLCUDA tensor
 * with LIKE_CUDA), dtype (fp32, or fp64 too with LIKE_F64), same ndim and
 * shape, row-major dense, aligned. */
static bx_status check_like(const char *fn, const bx_tokred *s, size_t t, int64_t chunk,
                            const DLTensor *x, const char *what, int like) {
  int allow_cuda = (like & LIKE_CUDA) != 0, allow_f64 = (like & LIKE_F64) != 0;
  char where[80];
  if (chunk >= 0) snprintf(where, sizeof where, "tensor %zu, chunk %lld", t, (long long)chunk);
  else snprintf(where, sizeof where, "tensor %zu", t);
  if (!x) return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t, "%s: %s: %s is NULL", fn, where, what);
  if (!host_readable(x->device.device_type) && !(allow_cuda && x->device.device_type == kDLCUDA))
    return bx_fail_at(BX_EDEVICE, -1, BX_NO_INDEX, t,
                      "%s: %s: %s is on device type %d, not host-readable memory", fn, where,
                      what, (int)x->device.device_type);
  if (!is_f32(x->dtype) && !(allow_f64 && is_f64(x->dtype)))
    return bx_fail_at(BX_EDTYPE, -1, BX_NO_INDEX, t,
                      "%s: %s: %s has dtype (code %d, bits %d, lanes %d); %s", fn, where, what,
                      (int)x->dtype.code, (int)x->dtype.bits, (int)x->dtype.lanes,
                      allow_f64 ? "fp32 or fp64 needed" : "fp32 needed");
  const int64_t *sh = s->shape + s->shape_at[t];
  if (x->ndim != s->ndim[t] || (x->ndim > 0 && !x->shape))
    return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, t,
                      "%s: %s: %s has %d dimensions, the gradient %d", fn, where, what, x->ndim,
                      s->ndim[t]);
  for (int d = 0; d < x->ndim; d++)
    if (x->shape[d] != sh[d])
      return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, t,
                        "%s: %s: %s has size %lld in dimension %d, the gradient %lld", fn, where,
                        what, (long long)x->shape[d], d, (long long)sh[d]);
  if (x->strides) {
    int64_t want = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
      if (x->shape[d] != 1 && x->strides[d] != want)
        return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, t,
                          "%s: %s: %s is not dense row-major (stride %lld in dimension %d, "
                          "%lld expected)",
                          fn, where, what, (long long)x->strides[d], d, (long long)want);
      want *= x->shape[d];
    }
  }
  size_t esz = is_f64(x->dtype) ? 8 : 4;
  if (s->numel[t] > 0) {
    if (!x->data)
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t, "%s: %s: %s has NULL data", fn, where,
                        what);
    uintptr_t p = (uintptr_t)x->data + (uintptr_t)x->byte_offset;
    if (p % esz)
      return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, t,
                        "%s: %s: %s is not aligned to its %zu-byte elements", fn, where, what,
                        esz);
  }
  return BX_OK;
}

static const float *f32_data(const DLTensor *x) {
  return (const float *)(const void *)((const char *)x->data + x->byte_offset);
}

/* 1 for a partial on a CUDA device (check_like with LIKE_CUDA lets it
 * through): bx_tokred_bound / bx_tokred_add then run the device's kernels
 * through train_device.h's table (BX_EDEVICE naming the call when this
 * build has none). */
static int on_cuda(const DLTensor *x) { return x && bx_tc_on_device(x); }

static bx_status check_tensor_index(const char *fn, const bx_tokred *s, size_t t) {
  if (t >= s->ntensors)
    return bx_fail(BX_EINVAL, "%s: tensor %zu does not exist (the state has %zu)", fn, t,
                   s->ntensors);
  return BX_OK;
}

static bx_status check_chunk(const char *fn, const bx_tokred *s, size_t t, int64_t c) {
  if (c < 0 || c >= s->nchunks)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t,
                      "%s: tensor %zu: chunk %lld is outside [0, %lld) (%lld tokens in chunks "
                      "of %lld)",
                      fn, t, (long long)c, (long long)s->nchunks, (long long)s->total_tokens,
                      (long long)s->chunk_tokens);
  return BX_OK;
}

/* ---- create / destroy / fork ------------------------------------------- */

static void free_state(bx_tokred *s) {
  if (!s) return;
  free(s->numel);
  free(s->ndim);
  free(s->shape);
  free(s->shape_at);
  free(s->word_at);
  free(s->bound);
  free(s->grid);
  free(s->observed);
  free(s->flagged);
  free(s->words);
  free(s->scratch);
  free(s->fsum);
  free(s);
}

/* Every tensor's bound and observation back to "nothing seen", no grid,
 * no flag (a new state, bx_tokred_reset). */
static void clear_tensors(bx_tokred *s) {
  for (size_t t = 0; t < s->ntensors; t++) {
    s->bound[t] = s->observed[t] = BX_TOKRED_EMIN;
    s->grid[t] = 0;
    s->flagged[t] = 0;
  }
}

/* Allocation of a state whose numel/ndim/shape/shape_at are filled:
 * words, offsets, bounds, fsum. */
static bx_status alloc_rest(const char *fn, bx_tokred *s) {
  size_t n = s->ntensors ? s->ntensors : 1;
  s->word_at = malloc(n * sizeof *s->word_at);
  s->bound = malloc(n * sizeof *s->bound);
  s->grid = malloc(n * sizeof *s->grid);
  s->observed = malloc(n * sizeof *s->observed);
  s->flagged = calloc(n, sizeof *s->flagged);
  if (!s->word_at || !s->bound || !s->grid || !s->observed || !s->flagged) goto oom;
  size_t at = 0, elems = 0;
  for (size_t t = 0; t < s->ntensors; t++) {
    s->word_at[t] = at;
    at += (size_t)s->numel[t] + 1;
    elems += (size_t)s->numel[t];
  }
  clear_tensors(s);
  s->cover_at = at;
  uint64_t cover = (uint64_t)s->ntensors * (uint64_t)s->nchunks;
  if (cover > ((uint64_t)1 << 40) || at > ((size_t)1 << 60))
    return bx_fail(BX_ENOMEM, "%s: %zu tensors x %lld chunks of coverage words is too many", fn,
                   s->ntensors, (long long)s->nchunks);
  s->nwords = at + (size_t)cover;
  s->words = calloc(s->nwords ? s->nwords : 1, sizeof *s->words);
  if (!s->words) goto oom;
  s->fsum_total = elems;
  if (s->mode == BX_TOKRED_ORDINARY) {
    s->fsum = calloc(elems ? elems : 1, sizeof *s->fsum);
    if (!s->fsum) goto oom;
  }
  return BX_OK;
oom:
  return bx_fail(BX_ENOMEM, "%s: cannot allocate the state (%zu tensors)", fn, s->ntensors);
}

static bx_status create_impl(const char *fn, const DLTensor *grads, size_t ntensors,
                             int64_t chunk_tokens, int64_t total_tokens, const bx_tokred_opts *o,
                             bx_tokred **out) {
  if (!out) return bx_fail(BX_EINVAL, "%s: out is NULL", fn);
  if (ntensors > 0 && !grads)
    return bx_fail(BX_EINVAL, "%s: grads is NULL with ntensors %zu", fn, ntensors);
  if (chunk_tokens < 1)
    return bx_fail(BX_EINVAL, "%s: chunk_tokens %lld must be >= 1", fn, (long long)chunk_tokens);
  if (total_tokens < 0)
    return bx_fail(BX_EINVAL, "%s: total_tokens %lld must be >= 0", fn, (long long)total_tokens);
  if (o->mode != BX_TOKRED_GRID && o->mode != BX_TOKRED_ORDINARY)
    return bx_fail(BX_EINVAL, "%s: unknown mode %d", fn, (int)o->mode);
  if (o->on_bound != BX_TOKRED_BOUND_FAIL && o->on_bound != BX_TOKRED_BOUND_FLAG)
    return bx_fail(BX_EINVAL, "%s: unknown on_bound %d (BX_TOKRED_BOUND_FAIL or _FLAG)", fn,
                   (int)o->on_bound);
  int64_t nchunks = total_tokens / chunk_tokens + (total_tokens % chunk_tokens != 0);
  if (nchunks > BX_TOKRED_MAX_CHUNKS)
    return bx_fail(BX_EINVAL, "%s: %lld chunks exceed BX_TOKRED_MAX_CHUNKS (2^38)", fn,
                   (long long)nchunks);
  size_t nshape = 0;
  for (size_t t = 0; t < ntensors; t++) {
    const DLTensor *g = &grads[t];
    if (!host_readable(g->device.device_type))
      return bx_fail_at(BX_EDEVICE, -1, BX_NO_INDEX, t,
                        "%s: tensor %zu is on device type %d, not host-readable memory", fn, t,
                        (int)g->device.device_type);
    if (!is_f32(g->dtype))
      return bx_fail_at(BX_EDTYPE, -1, BX_NO_INDEX, t,
                        "%s: tensor %zu has dtype (code %d, bits %d, lanes %d); the token "
                        "reduction takes fp32 gradients",
                        fn, t, (int)g->dtype.code, (int)g->dtype.bits, (int)g->dtype.lanes);
    if (g->ndim < 0 || (g->ndim > 0 && !g->shape))
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t, "%s: tensor %zu: bad ndim %d or NULL shape",
                        fn, t, g->ndim);
    int64_t n = 1;
    for (int d = 0; d < g->ndim; d++) {
      if (g->shape[d] < 0)
        return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t, "%s: tensor %zu: negative size %lld",
                          fn, t, (long long)g->shape[d]);
      if (g->shape[d] > 0 && n > (((int64_t)1 << 50) / g->shape[d]))
        return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t, "%s: tensor %zu: too many elements",
                          fn, t);
      n *= g->shape[d];
    }
    nshape += (size_t)g->ndim;
  }
  bx_status st = BX_OK;
  bx_tokred *s = calloc(1, sizeof *s);
  if (!s) return bx_fail(BX_ENOMEM, "%s: cannot allocate the state", fn);
  s->mode = (int)o->mode;
  s->on_bound = (int)o->on_bound;
  s->ntensors = ntensors;
  s->chunk_tokens = chunk_tokens;
  s->total_tokens = total_tokens;
  s->nchunks = nchunks;
  size_t n1 = ntensors ? ntensors : 1;
  s->numel = malloc(n1 * sizeof *s->numel);
  s->ndim = malloc(n1 * sizeof *s->ndim);
  s->shape_at = malloc(n1 * sizeof *s->shape_at);
  s->shape = malloc((nshape ? nshape : 1) * sizeof *s->shape);
  if (!s->numel || !s->ndim || !s->shape_at || !s->shape) {
    st = bx_fail(BX_ENOMEM, "%s: cannot allocate the state (%zu tensors)", fn, ntensors);
    goto fail;
  }
  size_t at = 0;
  for (size_t t = 0; t < ntensors; t++) {
    int64_t n = 1;
    s->ndim[t] = grads[t].ndim;
    s->shape_at[t] = at;
    for (int d = 0; d < grads[t].ndim; d++) {
      s->shape[at++] = grads[t].shape[d];
      n *= grads[t].shape[d];
    }
    s->numel[t] = n;
  }
  st = alloc_rest(fn, s);
  if (st != BX_OK) goto fail;
  *out = s;
  return BX_OK;
fail:
  free_state(s);
  return st;
}

bx_status bx_tokred_create(const DLTensor *grads, size_t ntensors, int64_t chunk_tokens,
                           int64_t total_tokens, const bx_tokred_opts *opts, bx_tokred **out) {
  static const char *fn = "bx_tokred_create";
  bx_status st = check_opts_size(fn, opts); /* before anything else */
  if (st != BX_OK) return st;
  bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
  if (opts) o = *opts;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = create_impl(fn, grads, ntensors, chunk_tokens, total_tokens, &o, out);
  bx_call_leave(&c);
  return st;
}

void bx_tokred_destroy(bx_tokred *s) { free_state(s); }

bx_status bx_tokred_reset(bx_tokred *s, const bx_tokred_opts *opts) {
  static const char *fn = "bx_tokred_reset";
  bx_status st = check_opts_size(fn, opts); /* before anything else */
  if (st != BX_OK) return st;
  bx_call c;
  st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!s) st = bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  else if (opts && (int)opts->mode != s->mode)
    st = bx_fail(BX_EINVAL, "%s: opts->mode %d is not the state's mode %d (create a new state)", fn,
                 (int)opts->mode, s->mode);
  else if (opts && opts->on_bound != BX_TOKRED_BOUND_FAIL && opts->on_bound != BX_TOKRED_BOUND_FLAG)
    st = bx_fail(BX_EINVAL, "%s: unknown on_bound %d", fn, (int)opts->on_bound);
  if (st == BX_OK) {
    if (opts) s->on_bound = (int)opts->on_bound;
    s->agreed = 0;
    memset(s->words, 0, s->nwords * sizeof *s->words);
    if (s->fsum) memset(s->fsum, 0, s->fsum_total * sizeof *s->fsum);
    clear_tensors(s);
  }
  bx_call_leave(&c);
  return st;
}

static bx_status fork_impl(const char *fn, const bx_tokred *s, bx_tokred **out) {
  if (!s || !out) return bx_fail(BX_EINVAL, "%s: %s is NULL", fn, s ? "out" : "s");
  if (!s->agreed)
    return bx_fail(BX_EINVAL, "%s: the grid is not agreed yet (call bx_tokred_agree first)", fn);
  bx_tokred *f = calloc(1, sizeof *f);
  if (!f) return bx_fail(BX_ENOMEM, "%s: cannot allocate the state", fn);
  bx_status st = BX_OK;
  f->mode = s->mode;
  f->on_bound = s->on_bound;
  f->ntensors = s->ntensors;
  f->chunk_tokens = s->chunk_tokens;
  f->total_tokens = s->total_tokens;
  f->nchunks = s->nchunks;
  size_t n1 = s->ntensors ? s->ntensors : 1, nshape = 0;
  for (size_t t = 0; t < s->ntensors; t++) nshape += (size_t)s->ndim[t];
  f->numel = malloc(n1 * sizeof *f->numel);
  f->ndim = malloc(n1 * sizeof *f->ndim);
  f->shape_at = malloc(n1 * sizeof *f->shape_at);
  f->shape = malloc((nshape ? nshape : 1) * sizeof *f->shape);
  if (!f->numel || !f->ndim || !f->shape_at || !f->shape) {
    st = bx_fail(BX_ENOMEM, "%s: cannot allocate the state", fn);
    goto fail;
  }
  memcpy(f->numel, s->numel, s->ntensors * sizeof *f->numel);
  memcpy(f->ndim, s->ndim, s->ntensors * sizeof *f->ndim);
  memcpy(f->shape_at, s->shape_at, s->ntensors * sizeof *f->shape_at);
  if (nshape) memcpy(f->shape, s->shape, nshape * sizeof *f->shape);
  st = alloc_rest(fn, f);
  if (st != BX_OK) goto fail;
  if (s->ntensors) {
    memcpy(f->bound, s->bound, s->ntensors * sizeof *f->bound);
    memcpy(f->grid, s->grid, s->ntensors * sizeof *f->grid);
  }
  f->agreed = 1;
  *out = f;
  return BX_OK;
fail:
  free_state(f);
  return st;
}

bx_status bx_tokred_fork(const bx_tokred *s, bx_tokred **out) {
  static const char *fn = "bx_tokred_fork";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = fork_impl(fn, s, out);
  bx_call_leave(&c);
  return st;
}

/* ---- layouts ----------------------------------------------------------- */

static bx_status chunks_impl(const char *fn, const bx_tokred *s, int64_t b, int64_t e,
                             int64_t *cb, int64_t *ce) {
  if (!s || !cb || !ce) return bx_fail(BX_EINVAL, "%s: NULL argument", fn);
  int64_t C = s->chunk_tokens, T = s->total_tokens;
  if (b < 0 || e < b || e > T)
    return bx_fail(BX_ELAYOUT, "%s: token range [%lld, %lld) is not inside the global batch "
                   "[0, %lld)", fn, (long long)b, (long long)e, (long long)T);
  if (b % C != 0 && b != T)
    return bx_fail(BX_ELAYOUT,
                   "%s: token range [%lld, %lld) starts inside chunk %lld (tokens [%lld, %lld)): "
                   "a micro-batch or rank must hold whole chunks of %lld global tokens",
                   fn, (long long)b, (long long)e, (long long)(b / C), (long long)(b / C * C),
                   (long long)(b / C * C + C), (long long)C);
  if (e % C != 0 && e != T)
    return bx_fail(BX_ELAYOUT,
                   "%s: token range [%lld, %lld) ends inside chunk %lld (tokens [%lld, %lld)): "
                   "a micro-batch or rank must hold whole chunks of %lld global tokens",
                   fn, (long long)b, (long long)e, (long long)(e / C), (long long)(e / C * C),
                   (long long)(e / C * C + C < T ? e / C * C + C : T), (long long)C);
  *cb = b / C + (b % C != 0);
  *ce = e / C + (e % C != 0);
  return BX_OK;
}

bx_status bx_tokred_chunks(const bx_tokred *s, int64_t token_begin, int64_t token_end,
                           int64_t *chunk_begin, int64_t *chunk_end) {
  static const char *fn = "bx_tokred_chunks";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = chunks_impl(fn, s, token_begin, token_end, chunk_begin, chunk_end);
  bx_call_leave(&c);
  return st;
}

/* ---- bounds ------------------------------------------------------------ */

/* The largest finite |bits| of a partial: the active ISA's kernel
 * (kernels.h, bx_tokred_maxabs_fn), or the device's for a CUDA partial. */

static bx_status bound_impl(const char *fn, bx_tokred *s, size_t t, int64_t chunk,
                            const DLTensor *p) {
  if (!s) return bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  bx_status st = check_tensor_index(fn, s, t);
  if (st == BX_OK) st = check_chunk(fn, s, t, chunk);
  if (st == BX_OK && s->agreed)
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t,
                    "%s: tensor %zu, chunk %lld: the grid is already agreed (bounds come before "
                    "bx_tokred_agree)",
                    fn, t, (long long)chunk);
  if (st == BX_OK) st = check_like(fn, s, t, chunk, p, "the partial", LIKE_CUDA);
  if (st != BX_OK) return st;
  uint32_t mx = 0;
  if (on_cuda(p)) { /* the device's kernel: the same maximum */
    const bx_train_device *dev;
    st = bx_train_cuda(fn, &dev);
    if (st == BX_OK && s->numel[t] > 0)
      st = dev->tokred_maxabs(fn, p->device.device_id, f32_data(p), 0, 1, (size_t)s->numel[t], 1,
                              &mx);
    if (st != BX_OK) return st;
  } else {
    mx = bx_tokred_kernels_active()->max_abs(f32_data(p), (size_t)s->numel[t]);
  }
  int E = bx_tokred_exp_of_abs(mx);
  if (E > s->bound[t]) s->bound[t] = E;
  return BX_OK;
}

bx_status bx_tokred_bound(bx_tokred *s, size_t tensor, int64_t chunk, const DLTensor *partial) {
  static const char *fn = "bx_tokred_bound";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = bound_impl(fn, s, tensor, chunk, partial);
  bx_call_leave(&c);
  return st;
}

bx_status bx_tokred_bound_exp(bx_tokred *s, size_t tensor, int exp2) {
  static const char *fn = "bx_tokred_bound_exp";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!s) st = bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  else st = check_tensor_index(fn, s, tensor);
  if (st == BX_OK && (exp2 < BX_TOKRED_EMIN || exp2 > BX_TOKRED_EMAX))
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, tensor,
                    "%s: tensor %zu: exp2 %d is outside [-149, 128]", fn, tensor, exp2);
  if (st == BX_OK && s->agreed)
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, tensor,
                    "%s: tensor %zu: the grid is already agreed", fn, tensor);
  if (st == BX_OK && exp2 > s->bound[tensor]) s->bound[tensor] = exp2;
  bx_call_leave(&c);
  return st;
}

bx_status bx_tokred_observed(const bx_tokred *s, size_t tensor, int *exp2, int64_t *flagged) {
  static const char *fn = "bx_tokred_observed";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!s || !exp2) st = bx_fail(BX_EINVAL, "%s: NULL argument", fn);
  else st = check_tensor_index(fn, s, tensor);
  if (st == BX_OK) {
    *exp2 = s->observed[tensor];
    if (flagged) *flagged = s->flagged[tensor];
  }
  bx_call_leave(&c);
  return st;
}

bx_status bx_tokred_grid_exp(const bx_tokred *s, size_t tensor, int *exp2) {
  static const char *fn = "bx_tokred_grid_exp";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!s || !exp2) st = bx_fail(BX_EINVAL, "%s: NULL argument", fn);
  else st = check_tensor_index(fn, s, tensor);
  if (st == BX_OK && (!s->agreed || s->mode != BX_TOKRED_GRID))
    st = bx_fail(BX_EINVAL, "%s: %s", fn,
                 s->agreed ? "the ordinary mode has no grid" : "the grid is not agreed yet");
  if (st == BX_OK) *exp2 = s->grid[tensor];
  bx_call_leave(&c);
  return st;
}

/* ---- adding a partial -------------------------------------------------- */

/* The rounding onto the grid is the active ISA's kernel (kernels.h,
 * bx_tokred_grid_fn: src/cpu/{portable,avx2,avx512}_tokred.c, identical
 * words). Undoing one is the scalar rule: */
void bx_tokred_grid_sub(int64_t *w, const float *a, size_t n, double inv_step) {
  for (size_t i = 0; i < n; i++) {
    uint32_t b;
    memcpy(&b, &a[i], sizeof b);
    if ((b & 0x7fffffffu) < 0x7f800000u) /* modulo 2^64, as the kernels add */
      w[i] = (int64_t)((uint64_t)w[i] - (uint64_t)bx_tokred_q(a[i], inv_step));
  }
}

/* f[i] += a[i] in fp32 (the ordinary mode); returns the non-finite count. */
BX_VECTORIZE int64_t bx_tokred_plain_add(float *restrict f, const float *restrict a, size_t n) {
  int64_t nf = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t b;
    memcpy(&b, &a[i], sizeof b);
    nf += (b & 0x7fffffff) >= 0x7f800000;
    f[i] += a[i];
  }
  return nf;
}

bx_status bx_tokred_add_check(const char *fn, const bx_tokred *s, size_t t, int64_t chunk) {
  if (!s) return bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  bx_status st = check_tensor_index(fn, s, t);
  if (st == BX_OK) st = check_chunk(fn, s, t, chunk);
  if (st == BX_OK && !s->agreed)
    st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t,
                    "%s: tensor %zu, chunk %lld: the grid is not agreed yet (call "
                    "bx_tokred_agree before adding)",
                    fn, t, (long long)chunk);
  return st;
}

int bx_tokred_breaks(const bx_tokred *s, size_t t, uint32_t mx) {
  return s->on_bound == BX_TOKRED_BOUND_FAIL && mx >= bx_tokred_abs_limit(s->bound[t]);
}

void bx_tokred_observe(bx_tokred *s, size_t t, uint32_t mx) {
  int E = bx_tokred_exp_of_abs(mx);
  if (E > s->observed[t]) s->observed[t] = E;
  if (mx >= bx_tokred_abs_limit(s->bound[t])) s->flagged[t] += 1;
}

bx_status bx_tokred_bound_fail_at(const char *fn, const bx_tokred *s, size_t t, int64_t chunk,
                                  size_t i, float value) {
  return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t,
                    "%s: tensor %zu, chunk %lld, element %zu: |%a| is not below the agreed "
                    "bound 2^%d (the partial differs from the one bounded, or a stated "
                    "bound was too small); nothing was added",
                    fn, t, (long long)chunk, i, (double)value, s->bound[t]);
}

bx_status bx_tokred_bound_fail(const char *fn, const bx_tokred *s, size_t t, int64_t chunk,
                               const float *a, size_t n) {
  uint32_t lim = bx_tokred_abs_limit(s->bound[t]);
  const uint32_t *u = (const uint32_t *)(const void *)a;
  size_t i = 0;
  while (i < n && !((u[i] & 0x7fffffffu) >= lim && (u[i] & 0x7fffffffu) < 0x7f800000u)) i++;
  return bx_tokred_bound_fail_at(fn, s, t, chunk, i, a[i < n ? i : 0]);
}

/* w[i] += q[i], modulo 2^64 (the device's words into the state's). */
BX_VECTORIZE void bx_tokred_words_add(int64_t *restrict w, const int64_t *restrict q, size_t n) {
  for (size_t i = 0; i < n; i++) w[i] = (int64_t)((uint64_t)w[i] + (uint64_t)q[i]);
}

/* add_impl for a partial on a CUDA device, checked: grid mode, the
 * device's kernel rounds every element onto the grid (the q words come
 * back and are added here, only when the add stands: s is unchanged on
 * error); ordinary mode, the partial comes to the host and is added in
 * fp32 as there. */
static bx_status add_cuda(const char *fn, bx_tokred *s, size_t t, int64_t chunk, const DLTensor *p,
                          int64_t *nf) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st != BX_OK) return st;
  size_t n = (size_t)s->numel[t];
  int64_t *w = s->words + s->word_at[t];
  if (n == 0) return BX_OK;
  void *ws = bx_workspace(n * sizeof(int64_t));
  if (!ws) return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of host staging", fn,
                          n * sizeof(int64_t));
  if (s->mode == BX_TOKRED_GRID) {
    bx_tokred_dev_res r;
    st = dev->tokred_grid(fn, p->device.device_id, f32_data(p), n, bx_tokred_pow2(-s->grid[t]),
                          bx_tokred_abs_limit(s->bound[t]), ws, &r);
    if (st != BX_OK) return st;
    if (bx_tokred_breaks(s, t, r.mx))
      return bx_tokred_bound_fail_at(fn, s, t, chunk, (size_t)r.bad, r.bad_value);
    bx_tokred_words_add(w, ws, n);
    bx_tokred_observe(s, t, r.mx);
    *nf = r.nf;
  } else {
    st = dev->to_host(fn, p->device.device_id, ws, f32_data(p), n * sizeof(float));
    if (st != BX_OK) return st;
    *nf = bx_tokred_plain_add(s->fsum + (s->word_at[t] - t), ws, n);
  }
  return BX_OK;
}

static bx_status add_impl(const char *fn, bx_tokred *s, size_t t, int64_t chunk,
                          const DLTensor *p) {
  bx_status st = bx_tokred_add_check(fn, s, t, chunk);
  if (st == BX_OK) st = check_like(fn, s, t, chunk, p, "the partial", LIKE_CUDA);
  if (st != BX_OK) return st;
  const float *a = f32_data(p);
  size_t n = (size_t)s->numel[t];
  int64_t *w = s->words + s->word_at[t];
  int64_t nf = 0;
  if (on_cuda(p)) {
    st = add_cuda(fn, s, t, chunk, p, &nf);
    if (st != BX_OK) return st;
  } else if (s->mode == BX_TOKRED_GRID) {
    double inv = bx_tokred_pow2(-s->grid[t]);
    uint32_t mx = bx_tokred_kernels_active()->grid_add(w, a, n, inv, &nf);
    if (bx_tokred_breaks(s, t, mx)) {
      bx_tokred_grid_sub(w, a, n, inv); /* exactly undone: s unchanged */
      return bx_tokred_bound_fail(fn, s, t, chunk, a, n);
    }
    bx_tokred_observe(s, t, mx);
  } else {
    float *f = s->fsum + (s->word_at[t] - t); /* word_at counts one extra word per tensor */
    nf = bx_tokred_plain_add(f, a, n);
  }
  w[n] += nf;
  s->words[s->cover_at + t * (size_t)s->nchunks + (size_t)chunk] += 1;
  return BX_OK;
}

bx_status bx_tokred_add(bx_tokred *s, size_t tensor, int64_t chunk, const DLTensor *partial) {
  static const char *fn = "bx_tokred_add";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = add_impl(fn, s, tensor, chunk, partial);
  bx_call_leave(&c);
  return st;
}

/* ---- merge, words, allreduce ------------------------------------------- */

static int same_config(const bx_tokred *a, const bx_tokred *b) {
  if (a->mode != b->mode || a->on_bound != b->on_bound || a->ntensors != b->ntensors || a->chunk_tokens != b->chunk_tokens ||
      a->total_tokens != b->total_tokens || a->agreed != b->agreed)
    return 0;
  for (size_t t = 0; t < a->ntensors; t++) {
    if (a->ndim[t] != b->ndim[t] || a->grid[t] != b->grid[t] || a->bound[t] != b->bound[t])
      return 0;
    for (int d = 0; d < a->ndim[t]; d++)
      if (a->shape[a->shape_at[t] + (size_t)d] != b->shape[b->shape_at[t] + (size_t)d]) return 0;
  }
  return 1;
}

bx_status bx_tokred_merge(bx_tokred *into, const bx_tokred *from) {
  static const char *fn = "bx_tokred_merge";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!into || !from) st = bx_fail(BX_EINVAL, "%s: %s is NULL", fn, into ? "from" : "into");
  else if (into == from) st = bx_fail(BX_EINVAL, "%s: into and from are the same state", fn);
  else if (!into->agreed || !from->agreed)
    st = bx_fail(BX_EINVAL, "%s: merge states after bx_tokred_agree (and bx_tokred_fork)", fn);
  else if (!same_config(into, from))
    st = bx_fail(BX_EMISMATCH, "%s: the states differ in mode, tensors, chunks or grid", fn);
  if (st == BX_OK) {
    for (size_t i = 0; i < into->nwords; i++)
      into->words[i] = (int64_t)((uint64_t)into->words[i] + (uint64_t)from->words[i]);
    for (size_t t = 0; t < into->ntensors; t++) {
      if (from->observed[t] > into->observed[t]) into->observed[t] = from->observed[t];
      into->flagged[t] += from->flagged[t];
    }
    if (into->mode == BX_TOKRED_ORDINARY)
      for (size_t i = 0; i < into->fsum_total; i++) into->fsum[i] += from->fsum[i];
  }
  bx_call_leave(&c);
  return st;
}

bx_status bx_tokred_words(bx_tokred *s, int64_t **words, size_t *count) {
  static const char *fn = "bx_tokred_words";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  if (!s || !words || !count) st = bx_fail(BX_EINVAL, "%s: NULL argument", fn);
  else if (s->mode != BX_TOKRED_GRID)
    st = bx_fail(BX_EINVAL, "%s: the ordinary mode's fp32 sums are not summable int64 words",
                 fn);
  else if (!s->agreed) st = bx_fail(BX_EINVAL, "%s: the grid is not agreed yet", fn);
  if (st == BX_OK) {
    *words = s->words;
    *count = s->nwords;
  }
  bx_call_leave(&c);
  return st;
}

/* ---- finish ------------------------------------------------------------ */

/* 1 for a finish output on a CUDA device (kDLCUDA). A kDLCUDAManaged
 * output is host memory here: the words are in host memory, the host
 * writes managed memory directly (no kernel is in flight: every launcher
 * waits), so a copy through staging would only add one. */
static int out_cuda(const DLTensor *x) { return x && x->device.device_type == kDLCUDA; }

static bx_status finish_checks(const char *fn, const bx_tokred *s, DLTensor *out, size_t nout,
                               int64_t divisor) {
  if (!s) return bx_fail(BX_EINVAL, "%s: s is NULL", fn);
  if (!s->agreed) return bx_fail(BX_EINVAL, "%s: the grid is not agreed yet", fn);
  if (divisor < 1)
    return bx_fail(BX_EINVAL, "%s: divisor %lld must be >= 1", fn, (long long)divisor);
  if (nout != s->ntensors)
    return bx_fail(BX_EINVAL, "%s: %zu outputs for %zu tensors", fn, nout, s->ntensors);
  if (nout > 0 && !out) return bx_fail(BX_EINVAL, "%s: out is NULL", fn);
  for (size_t t = 0; t < s->ntensors; t++)
    if (s->flagged[t])
      return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, t,
                        "%s: tensor %zu: %lld adds broke the stated bound 2^%d (the largest "
                        "addend element is below 2^%d): the state is flagged "
                        "(BX_TOKRED_BOUND_FLAG) and its sums are void; run the step again with "
                        "a bound of at least 2^%d; nothing written",
                        fn, t, (long long)s->flagged[t], s->bound[t], s->observed[t],
                        s->observed[t]);
  for (size_t t = 0; t < s->ntensors; t++) {
    const int64_t *cov = s->words + s->cover_at + t * (size_t)s->nchunks;
    for (int64_t c = 0; c < s->nchunks; c++)
      if (cov[c] != 1)
        return bx_fail_at(BX_ELAYOUT, -1, BX_NO_INDEX, t,
                          "%s: tensor %zu, chunk %lld (tokens [%lld, %lld)) was added %lld "
                          "times over all threads, micro-batches and ranks; every chunk must "
                          "be added exactly once",
                          fn, t, (long long)c, (long long)(c * s->chunk_tokens),
                          (long long)((c + 1) * s->chunk_tokens < s->total_tokens
                                          ? (c + 1) * s->chunk_tokens
                                          : s->total_tokens),
                          (long long)cov[c]);
    int64_t nf = s->words[s->word_at[t] + (size_t)s->numel[t]];
    if (nf != 0)
      return bx_fail_at(BX_ENONFINITE, -1, BX_NO_INDEX, t,
                        "%s: tensor %zu: %lld NaN or Inf addend elements; nothing written", fn,
                        t, (long long)nf);
  }
  /* outputs all in host memory (managed included) or all kDLCUDA tensors
   * (finished into host staging, then copied: finish_cuda) */
  int cuda = nout > 0 && out_cuda(&out[0]);
  for (size_t t = 0; t < nout; t++) {
    if (out_cuda(&out[t]) != cuda)
      return bx_fail_at(BX_EDEVICE, -1, BX_NO_INDEX, t,
                        "%s: tensor %zu: the output is %s but output 0 is %s; the outputs must "
                        "all be kDLCUDA tensors or all in host memory",
                        fn, t, cuda ? "in host memory" : "a kDLCUDA tensor",
                        cuda ? "a kDLCUDA tensor" : "in host memory");
    bx_status st = check_like(fn, s, t, -1, &out[t], "the output",
                              cuda ? LIKE_F64 | LIKE_CUDA : LIKE_F64);
    if (st != BX_OK) return st;
  }
  if (cuda && !bx_train_device_cuda()) /* finish_check's answer is finish's */
    return bx_fail(BX_EDEVICE, "%s: the outputs are CUDA tensors, but this build of bitexact "
                   "has no CUDA backend (built without nvcc, or CUDA=0)", fn);
  if (nout > 1) return bx_check_writable(fn, out, nout, NULL, 0, cuda);
  return BX_OK;
}

/* 1 when every |w[i]| < 2^53 (the fast, exact conversion applies). */
BX_VECTORIZE static int all_small(const int64_t *restrict w, size_t n) {
  const uint64_t lim = (uint64_t)1 << 53;
  int64_t big = 0;
  for (size_t i = 0; i < n; i++) big |= (int64_t)((uint64_t)w[i] + lim >= 2 * lim);
  return big == 0;
}

/* Q * 2^e with |Q| < 2^53: exact in double, then one rounding to fp32. */
BX_VECTORIZE static void small_to_f32(float *restrict y, const int64_t *restrict w, size_t n,
                                      double step) {
  for (size_t i = 0; i < n; i++) y[i] = (float)((double)w[i] * step);
}

BX_VECTORIZE static void small_to_f64(double *restrict y, const int64_t *restrict w, size_t n,
                                      double step) {
  for (size_t i = 0; i < n; i++) y[i] = (double)w[i] * step; /* exact */
}

static void finish_grid(const int64_t *w, size_t n, int e, int64_t d, DLTensor *o) {
  void *base = (char *)o->data + o->byte_offset;
  int f64 = is_f64(o->dtype);
  double step = bx_tokred_pow2(e);
  if (d == 1 && all_small(w, n)) {
    if (f64) small_to_f64(base, w, n, step);
    else small_to_f32(base, w, n, step);
  } else if (f64) {
    double *y = base;
    for (size_t i = 0; i < n; i++) y[i] = bx_tokred_finish_f64(w[i], e, d, step);
  } else {
    float *y = base;
    for (size_t i = 0; i < n; i++) y[i] = bx_tokred_finish_f32(w[i], e, d, step);
  }
}

static void finish_ordinary(const float *f, size_t n, int64_t d, DLTensor *o) {
  void *base = (char *)o->data + o->byte_offset;
  float fd = (float)d;
  for (size_t i = 0; i < n; i++) {
    float v = d == 1 ? f[i] : f[i] / fd;
    if (is_f64(o->dtype)) ((double *)base)[i] = (double)v;
    else ((float *)base)[i] = v;
  }
}

/* The finish of every tensor into out[t] (checked), on the host. */
static void finish_all(const bx_tokred *s, DLTensor *out, size_t nout, int64_t divisor) {
  for (size_t t = 0; t < nout; t++) {
    size_t n = (size_t)s->numel[t];
    if (s->mode == BX_TOKRED_GRID)
      finish_grid(s->words + s->word_at[t], n, s->grid[t], divisor, &out[t]);
    else
      finish_ordinary(s->fsum + (s->word_at[t] - t), n, divisor, &out[t]);
  }
}

/* The bytes of finish output t (fp32 or fp64). */
static size_t out_bytes(const bx_tokred *s, const DLTensor *out, size_t t) {
  return (size_t)s->numel[t] * (is_f64(out[t].dtype) ? 8 : 4);
}

/* kDLCUDA outputs (checked): the host's finish into host staging (the same
 * bits), then each copied to its device with the table's to_device. The
 * outputs' old bytes are read back first, so that a failed copy puts the
 * outputs already copied back as they were: a failed call leaves every
 * output unchanged (unless the restoring copies fail too: the device is
 * then lost, BX_EDEVICE). */
static bx_status finish_cuda(const char *fn, const bx_tokred *s, DLTensor *out, size_t nout,
                             int64_t divisor) {
  const bx_train_device *dev;
  bx_status st = bx_train_cuda(fn, &dev);
  if (st != BX_OK) return st;
  size_t total = 0;
  for (size_t t = 0; t < nout; t++)
    total += out_bytes(s, out, t);
  if (!total) return BX_OK;
  char *stage = malloc(2 * total), *old = stage + total;
  DLTensor *h = malloc(nout * sizeof *h);
  if (!stage || !h) {
    free(stage);
    free(h);
    return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu bytes of host staging", fn, 2 * total);
  }
  size_t off = 0;
  for (size_t t = 0; t < nout; t++) { /* the host views of the staging */
    h[t] = out[t];
    h[t].device = (DLDevice){kDLCPU, 0};
    h[t].data = stage + off;
    h[t].byte_offset = 0;
    off += out_bytes(s, out, t);
  }
  finish_all(s, h, nout, divisor);
  off = 0;
  for (size_t t = 0; st == BX_OK && t < nout; t++) { /* the old bytes */
    size_t b = out_bytes(s, out, t);
    if (b)
      st = dev->to_host(fn, out[t].device.device_id, old + off,
                        (const char *)out[t].data + out[t].byte_offset, b);
    off += b;
  }
  off = 0;
  size_t done = 0;
  for (; st == BX_OK && done < nout; done++) {
    size_t b = out_bytes(s, out, done);
    if (b)
      st = dev->to_device(fn, out[done].device.device_id,
                          (char *)out[done].data + out[done].byte_offset, stage + off, b);
    if (st != BX_OK) break;
    off += b;
  }
  if (st != BX_OK && done < nout) { /* put back the outputs copied before output done */
    off = 0;
    for (size_t t = 0; t <= done; t++) {
      size_t b = out_bytes(s, out, t);
      if (b)
        (void)dev->to_device(fn, out[t].device.device_id,
                             (char *)out[t].data + out[t].byte_offset, old + off, b);
      off += b;
    }
  }
  free(stage);
  free(h);
  return st;
}

bx_status bx_tokred_finish_check(const bx_tokred *s, DLTensor *out, size_t nout, int64_t divisor) {
  static const char *fn = "bx_tokred_finish";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = finish_checks(fn, s, out, nout, divisor);
  bx_call_leave(&c);
  return st;
}

bx_status bx_tokred_finish(const bx_tokred *s, DLTensor *out, size_t nout, int64_t divisor) {
  static const char *fn = "bx_tokred_finish";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = finish_checks(fn, s, out, nout, divisor);
  if (st == BX_OK && nout && out_cuda(&out[0])) st = finish_cuda(fn, s, out, nout, divisor);
  else if (st == BX_OK) finish_all(s, out, nout, divisor);
  bx_call_leave(&c);
  return st;
}
