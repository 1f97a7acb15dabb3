/*
 * cuda_internal.h — what the CUDA files share: the chunk table (the
 * multi-tensor launch's work list), the plan, the kernel launchers.
 */
#ifndef BX_CUDA_INTERNAL_H
#define BX_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "bitexact_cuda.h"
#include "exact_window.h"
#include "norm_finish.h"
#include "internal.h"

/* One block's unit of work: up to BX_CU_CHUNK elements of one tensor. */
typedef struct bx_cu_chunk {
  const void *data; /* first element of the chunk */
  uint32_t n;       /* elements, 1..BX_CU_CHUNK */
  uint16_t dtype;   /* bx_dtype */
  uint16_t unused;
  uint32_t group;
  uint32_t tensor; /* index in its group (for the NaN/Inf location) */
} bx_cu_chunk;

struct bx_cuda_plan {
  int device;
  size_t ngroups, nchunks;
  int mode;            /* bx_mode (internal.h) */
  int int_squares;     /* squares of fp32/bf16/fp16 by integer windows instead of the
                          fp64 grid (BX_CUDA_SQUARES=int; the same bits either way) */
  bx_clip_opts opts;
  int has_comm;
  bx_comm comm;
  int grid;            /* blocks of the reduction kernel: all resident at once */
  int grid_scale;      /* blocks of the scaling kernel */
  int64_t agree[BX_CU_AGREE_ITEMS]; /* this rank's values, max_norm's slot filled per call */
  /* device memory, one allocation (base) */
  void *base;
  bx_cu_chunk *chunks;
  int64_t *accs;     /* ngroups * BX_ACC_WORDS raw words */
  uint64_t *ext;     /* ngroups * BX_CU_EXT_WORDS */
  int64_t *offender; /* 1 word: first NaN/Inf key, -1 none */
  int64_t *wire;     /* BX_CU_AGREE_WORDS + ngroups * wire words */
  double *result;    /* blocking use: total, coef, then ngroups norms */
  int32_t *status;   /* the last call's device status (the scaling kernel reads it) */
  bx_mag *scratch;   /* the finishing kernel's magnitude view */
  int64_t *total_digits; /* the finishing kernel's running total */
  size_t wire_words;
  cudaEvent_t done;   /* recorded after each enqueue outside graph capture */
  int overlap;        /* two tensors share memory: norms fine, scaling refused */
  char overlap_msg[256];
};

/* Blocks of 256 threads of each kernel that fit on one SM at once (the
 * occupancy calculator; at least 1). */
int bx_cu_reduce_blocks_per_sm(void);
int bx_cu_scale_blocks_per_sm(void);

/* Launchers (reduce.cu, scale.cu). Each enqueues on stream and returns the
 * launch error (cudaSuccess when enqueued). */
cudaError_t bx_cu_launch_reduce(const bx_cuda_plan *plan, cudaStream_t stream, int rank);
/* wire: the agreement words (agree[], max_norm bits in item slot 8, the
 * failure key) and every group's words in norm.c's wire format. */
cudaError_t bx_cu_launch_wire(const bx_cuda_plan *plan, cudaStream_t stream, int64_t max_norm_bits,
                              int64_t failure_key);
/* finish: checks the agreement words, rounds every group and the total,
 * the coefficient (clip = 1) for max_norm; writes the outputs. */
/* out_code: the dtype of d_total (BX_DT_F64, _F32, _BF16, _F16): the norm
 * rounded once into it from the exact sum (p = 2, 1); other p: the fp64
 * norm converted. */
cudaError_t bx_cu_launch_finish(const bx_cuda_plan *plan, cudaStream_t stream, int clip,
                                double max_norm, int out_code, void *d_total, double *d_groups,
                                double *d_coef, int32_t *d_status);
/* scale every chunk by *d_coef (or coef_host when d_coef is NULL); skips
 * all writes when *d_status != 0 or (skip_one and the coefficient is 1). */
cudaError_t bx_cu_launch_scale(const bx_cuda_plan *plan, cudaStream_t stream,
                               const double *d_coef, double coef_host, const int32_t *d_status,
                               int skip_one);

#endif /* BX_CUDA_INTERNAL_H */
