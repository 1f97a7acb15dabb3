/*
 * dispatch.c — choosing the kernel table for this CPU at run time, once.
 * One binary carries portable, AVX2 and AVX-512 kernels; BX_ISA forces one
 * (for tests and benchmarks), never one the CPU cannot run.
 */
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kernels.h"

static _Atomic(const bx_kernels *) active;

#ifdef BX_HAVE_X86
/* F16C from CPUID leaf 1, ECX bit 29 (clang 14 has no "f16c" for
 * __builtin_cpu_supports); AVX/AVX-512 OS support is checked by the
 * builtins themselves. */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  return (c >> 29) & 1;
}
#endif

static int cpu_has_avx2(void) {
#ifdef BX_HAVE_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
         __builtin_cpu_supports("bmi2");
#else
  return 0;
#endif
}

static int cpu_has_avx512(void) {
#ifdef BX_HAVE_X86
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return 0;
#endif
}

/* The table named `name` if this CPU can run it, else NULL. */
static const bx_kernels *table_named(const char *name) {
  if (strcmp(name, "portable") == 0) return &bx_kernels_portable;
#ifdef BX_HAVE_X86
  if (strcmp(name, "avx2") == 0 && cpu_has_avx2()) return &bx_kernels_avx2;
  if (strcmp(name, "avx512") == 0 && cpu_has_avx512()) return &bx_kernels_avx512;
#endif
  return NULL;
}

static const bx_kernels *best_table(void) {
  const char *env = getenv("BX_ISA");
  const bx_kernels *k = env && *env ? table_named(env) : NULL;
  if (k) return k;
#ifdef BX_HAVE_X86
  if (cpu_has_avx512()) return &bx_kernels_avx512;
  if (cpu_has_avx2()) return &bx_kernels_avx2;
#endif
  return &bx_kernels_portable;
}

const bx_kernels *bx_kernels_active(void) {
  const bx_kernels *k = atomic_load_explicit(&active, memory_order_acquire);
  if (!k) {
    k = best_table(); /* idempotent: racing first calls agree */
    atomic_store_explicit(&active, k, memory_order_release);
  }
  return k;
}

bx_status bx_force_isa(const char *name) {
  if (!name) {
    atomic_store(&active, best_table());
    return BX_OK;
  }
  const bx_kernels *k = table_named(name);
  if (!k) return bx_fail(BX_EINVAL, "ISA '%s' is unknown or not supported by this CPU", name);
  atomic_store(&active, k);
  return BX_OK;
}

const char *bx_isa_name(void) { return bx_kernels_active()->name; }

const bx_scale_kernels *bx_scale_kernels_active(void) {
#ifdef BX_HAVE_X86
  if (bx_kernels_active() == &bx_kernels_avx512) return &bx_scale_avx512;
#endif
  return &bx_scale_portable;
}
