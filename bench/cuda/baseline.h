/*
 * baseline.h — the GPU benchmark's reference kernels (baseline.cu): what
 * the hardware does with the same bytes when there is nothing exact to
 * do. Plain C interface; each returns a cudaError_t as int (0 = launched).
 */
#ifndef BX_BENCH_CUDA_BASELINE_H
#define BX_BENCH_CUDA_BASELINE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads `bytes` bytes at p (16-byte aligned, bytes a multiple of 16) with
 * 16-byte loads and adds them up as integers; each block adds its sum into
 * *d_sink so the loads cannot be optimised away. The bandwidth bound of
 * any norm. */
int bxb_read(const void *p, size_t bytes, unsigned long long *d_sink, cudaStream_t s);

/* x[i] *= c in place: fp32 (n multiple of 4), or bf16 (n multiple of 8)
 * via fp32 with round-to-nearest-even — torch's grad.mul_(coef), a read
 * and a write of every byte: the bandwidth bound of the scaling step. */
int bxb_scale_f32(float *x, size_t n, float c, cudaStream_t s);
int bxb_scale_bf16(uint16_t *x, size_t n, float c, cudaStream_t s);

/* Gradient-like data, N(0, 1e-2^2)-ish, from a hash of the index. */
int bxb_fill_f32(float *x, size_t n, uint64_t seed, cudaStream_t s);
int bxb_fill_bf16(uint16_t *x, size_t n, uint64_t seed, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif /* BX_BENCH_CUDA_BASELINE_H */
