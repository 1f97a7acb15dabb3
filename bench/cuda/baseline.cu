/*
 * baseline.cu — reference kernels of the GPU benchmark (see baseline.h):
 * a plain read and a plain in-place multiply over the same bytes as the
 * exact norm and clip, grid-stride with 16-byte vector loads, enough
 * blocks to fill every SM. Not part of the library.
 */
#include "baseline.h"
#include "rng.h"

namespace {

const int THREADS = 256;

int blocks_for(size_t items) {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  size_t want = (items + THREADS - 1) / THREADS;
  size_t cap = (size_t)(sms > 0 ? sms : 80) * 16;
  return (int)(want < cap ? (want ? want : 1) : cap);
}

__global__ void read_kernel(const uint4 *__restrict__ p, size_t n16, unsigned long long *sink) {
  unsigned long long acc = 0;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) { /* 4 loads in flight */
    uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc += (unsigned long long)a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
    acc += (unsigned long long)c.x + c.y + c.z + c.w + d.x + d.y + d.z + d.w;
  }
  for (; i < n16; i += stride) {
    uint4 a = p[i];
    acc += (unsigned long long)a.x + a.y + a.z + a.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xFFFFFFFFu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sink, acc);
}

__global__ void scale_f32_kernel(float4 *x, size_t n4, float c) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 v = x[i];
    v.x = __fmul_rn(v.x, c);
    v.y = __fmul_rn(v.y, c);
    v.z = __fmul_rn(v.z, c);
    v.w = __fmul_rn(v.w, c);
    x[i] = v;
  }
}

__device__ uint32_t bf16x2_scaled(uint32_t w, float c) {
  uint32_t out = 0;
  for (int h = 0; h < 2; h++) {
    uint32_t b = (w >> (16 * h)) & 0xFFFFu;
    float f = __fmul_rn(__uint_as_float(b << 16), c);
    uint32_t u = __float_as_uint(f);
    uint32_t r = (u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) | 0x40u)            /* NaN: quiet */
                                                 : ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); /* RNE */
    out |= (r & 0xFFFFu) << (16 * h);
  }
  return out;
}

__global__ void scale_bf16_kernel(uint4 *x, size_t n8, float c) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += stride) {
    uint4 v = x[i];
    v.x = bf16x2_scaled(v.x, c);
    v.y = bf16x2_scaled(v.y, c);
    v.z = bf16x2_scaled(v.z, c);
    v.w = bf16x2_scaled(v.w, c);
    x[i] = v;
  }
}

__device__ float gauss_like(uint64_t i, uint64_t seed) {
  uint64_t z = bx_rng_hash64(seed, i);
  float s = 0.0f;
  for (int k = 0; k < 4; k++) s += (float)((z >> (16 * k)) & 0xFFFF) * (1.0f / 65536.0f);
  return (s - 2.0f) * 1.7320508f * 1e-2f;
}

__global__ void fill_f32_kernel(float *x, size_t n, uint64_t seed) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = gauss_like(i, seed);
}

__global__ void fill_bf16_kernel(uint16_t *x, size_t n, uint64_t seed) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = (uint16_t)(__float_as_uint(gauss_like(i, seed)) >> 16);
}

}  // namespace

extern "C" int bxb_read(const void *p, size_t bytes, unsigned long long *d_sink, cudaStream_t s) {
  size_t n16 = bytes / 16;
  read_kernel<<<blocks_for(n16 / 4), THREADS, 0, s>>>((const uint4 *)p, n16, d_sink);
  return (int)cudaGetLastError();
}

extern "C" int bxb_scale_f32(float *x, size_t n, float c, cudaStream_t s) {
  scale_f32_kernel<<<blocks_for(n / 4), THREADS, 0, s>>>((float4 *)x, n / 4, c);
  return (int)cudaGetLastError();
}

extern "C" int bxb_scale_bf16(uint16_t *x, size_t n, float c, cudaStream_t s) {
  scale_bf16_kernel<<<blocks_for(n / 8), THREADS, 0, s>>>((uint4 *)x, n / 8, c);
  return (int)cudaGetLastError();
}

extern "C" int bxb_fill_f32(float *x, size_t n, uint64_t seed, cudaStream_t s) {
  fill_f32_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, n, seed);
  return (int)cudaGetLastError();
}

extern "C" int bxb_fill_bf16(uint16_t *x, size_t n, uint64_t seed, cudaStream_t s) {
  fill_bf16_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, n, seed);
  return (int)cudaGetLastError();
}
