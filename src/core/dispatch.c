/*
 * dispatch.c — choosing the kernel table for this CPU at run time, once.
 *
 * One binary carries every ISA's kernels; the list below is the one place
 * an ISA is registered (its name, the CPU features it needs, its tables).
 * The automatic choice is the fastest table the CPU can run: the first
 * rule of cpu_rules that matches the CPU (vendor, family, model: tables
 * measured slower or faster there than their width suggests), else the
 * first ISA of the list the CPU runs (the widest). Every table gives the
 * same bits, so the choice changes only speed. BX_ISA (environment) and
 * bx_force_isa() force a table, never one the CPU cannot run.
 * bx_kernels_reason() says why the active one was chosen.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "error.h"
#include "kernels.h"

/* ---- what the CPU has --------------------------------------------------- */

enum {
  CPU_AVX2 = 1u << 0, /* with FMA, F16C, BMI2 and the OS saving ymm state */
  CPU_AVX512 = 1u << 1, /* F, DQ, BW, VL and the OS saving zmm state */
};

typedef struct cpu_id {
  char vendor[13];
  unsigned family, model; /* display family and model (extended fields added) */
  unsigned features;      /* CPU_* */
} cpu_id;

#ifdef BX_HAVE_X86
static unsigned long long xgetbv0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}
#endif

static void cpu_identify(cpu_id *c) {
  memset(c, 0, sizeof *c);
  strcpy(c->vendor, "unknown");
#ifdef BX_HAVE_X86
  unsigned a = 0, b = 0, cx = 0, d = 0, max = 0;
  if (!__get_cpuid(0, &max, &b, &cx, &d)) return;
  memcpy(c->vendor, &b, 4);
  memcpy(c->vendor + 4, &d, 4);
  memcpy(c->vendor + 8, &cx, 4);
  c->vendor[12] = 0;
  if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
  unsigned fam = (a >> 8) & 0xF, mod = (a >> 4) & 0xF;
  c->family = fam == 0xF ? fam + ((a >> 20) & 0xFF) : fam;
  c->model = fam == 0x6 || fam == 0xF ? mod + (((a >> 16) & 0xF) << 4) : mod;
  int fma = (cx >> 12) & 1, osxsave = (cx >> 27) & 1, avx = (cx >> 28) & 1, f16c = (cx >> 29) & 1;
  if (!osxsave || !avx || max < 7) return;
  unsigned long long xcr0 = xgetbv0();
  unsigned b7, c7, d7;
  __cpuid_count(7, 0, a, b7, c7, d7);
  (void)c7, (void)d7;
  int ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xE6) == 0xE6;
  int avx2 = (b7 >> 5) & 1, bmi2 = (b7 >> 8) & 1;
  int f = (b7 >> 16) & 1, dq = (b7 >> 17) & 1, bw = (b7 >> 30) & 1, vl = (b7 >> 31) & 1;
  if (ymm && avx2 && fma && f16c && bmi2) c->features |= CPU_AVX2;
  if ((c->features & CPU_AVX2) && zmm && f && dq && bw && vl) c->features |= CPU_AVX512;
#endif
}

#if defined(__aarch64__)
#define BX_ARCH_NAME "aarch64, no vector kernels"
#elif !defined(BX_HAVE_X86)
#define BX_ARCH_NAME "not x86-64"
#endif

/* ---- the ISAs: one registration line each, widest first ----------------- */

typedef struct isa {
  const char *name;
  unsigned needs; /* CPU_* */
  const bx_kernels *kernels;
  const bx_scale_kernels *scale;
  const bx_gemm_kernel *gemm;
  const bx_tokred_kernels *tokred;
  const bx_math_kernels *math;
} isa;

static const isa isas[] = {
#ifdef BX_HAVE_X86
    {"avx512", CPU_AVX512, &bx_kernels_avx512, &bx_scale_avx512, &bx_gemm_avx512, &bx_tokred_avx512,
     &bx_math_avx512},
    /* the AVX-512 norm kernels with one prefetch a line (avx512_pf1.c):
     * only a CPU rule chooses it */
    {"avx512-pf1", CPU_AVX512, &bx_kernels_avx512_pf1, &bx_scale_avx512, &bx_gemm_avx512, &bx_tokred_avx512,
     &bx_math_avx512},
    {"avx2", CPU_AVX2, &bx_kernels_avx2, &bx_scale_portable, &bx_gemm_avx2, &bx_tokred_avx2,
     &bx_math_avx2},
#endif
    {"portable", 0, &bx_kernels_portable, &bx_scale_portable, &bx_gemm_portable, &bx_tokred_portable,
     &bx_math_portable},
};
#define NISAS (sizeof isas / sizeof isas[0])

/* ---- CPUs on which the widest ISA is not the fastest ---------------------
 * A rule names the table measured fastest (bench_norm's forced-ISA rows,
 * 1 and 2 threads, gradient-like data of every dtype). Model ranges are
 * inclusive. */
typedef struct cpu_rule {
  const char *vendor;
  unsigned family, model_lo, model_hi;
  const char *isa;
  const char *what; /* the CPUs, and the measurement */
} cpu_rule;

static const cpu_rule cpu_rules[] = {
    /* Sapphire Rapids (0x8F), Emerald Rapids (0xCF), measured on a KVM
     * Emerald Rapids: before every line was prefetched (prefetch.h) AVX2
     * beat AVX-512 there (77.6% vs 52% of the read ceiling, fp32, 1
     * thread); now AVX-512 is ahead for every dtype (fp32 0.29-0.36 vs
     * 0.34-0.48 ns an element, bf16 0.17-0.22 vs 0.29-0.41, fp16 0.19-0.27
     * vs 0.30-0.34, fp64 0.73 vs 1.5). A rule that names the widest is
     * documentation: it says why. */
    {"GenuineIntel", 6, 0x8F, 0x8F, "avx512", "Sapphire Rapids: measured fastest, bench_norm forced rows"},
    {"GenuineIntel", 6, 0xCF, 0xCF, "avx512", "Emerald Rapids: measured fastest, bench_norm forced rows"},
    /* AMD EPYC 9005 (family 0x1A, models 0x00-0x1F), measured on a KVM
     * "AMD EPYC" of family 0x1A model 0x02 (docs/benchmarks.md, issue 26
     * item 5): the two prefetches a line of prefetch.h cost the fp32
     * kernels 15% of their streaming speed there (0.124 vs 0.105 ns an
     * element, 1 thread, 2^26 Gaussian), no prefetch at all is slower
     * still; one prefetcht2 8 KiB ahead is fastest for fp32 and as fast
     * for bf16. */
    {"AuthenticAMD", 0x1A, 0x00, 0x1F, "avx512-pf1", "EPYC 9005: one prefetch a line measured fastest, issue 26"},
};

/* ---- the choice --------------------------------------------------------- */

static cpu_id cpu;
static const isa *auto_isa;
static char auto_reason[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static _Atomic(const isa *) active;
static _Atomic(const char *) active_reason;
static char forced_reason[64];

static const isa *isa_named(const char *name) {
  for (size_t i = 0; i < NISAS; i++)
    if (strcmp(isas[i].name, name) == 0) return &isas[i];
  return NULL;
}

static int runs_here(const isa *s) { return (cpu.features & s->needs) == s->needs; }

static void choose_once(void) {
  cpu_identify(&cpu);
  char who[96];
  snprintf(who, sizeof who, "%s family 0x%x model 0x%x", cpu.vendor, cpu.family, cpu.model);
  const char *env = getenv("BX_ISA");
  if (env && *env) {
    const isa *s = isa_named(env);
    if (s && runs_here(s)) {
      auto_isa = s;
      snprintf(auto_reason, sizeof auto_reason, "%s: forced by the environment, BX_ISA=%s (%s)", s->name, env, who);
      return;
    }
  }
  for (size_t r = 0; r < sizeof cpu_rules / sizeof cpu_rules[0]; r++) {
    const cpu_rule *q = &cpu_rules[r];
    if (!q->isa || strcmp(q->vendor, cpu.vendor) != 0 || q->family != cpu.family ||
        cpu.model < q->model_lo || cpu.model > q->model_hi)
      continue;
    const isa *s = isa_named(q->isa);
    if (s && runs_here(s)) {
      auto_isa = s;
      snprintf(auto_reason, sizeof auto_reason, "%s: the CPU table's choice for %s (%s)", s->name, who, q->what);
      return;
    }
  }
  for (size_t i = 0; i < NISAS; i++)
    if (runs_here(&isas[i])) {
      auto_isa = &isas[i];
      break;
    }
#ifndef BX_HAVE_X86
  snprintf(auto_reason, sizeof auto_reason, "%s: the only kernel table built for this architecture (%s)%s%s%s",
           auto_isa->name, BX_ARCH_NAME, env && *env ? "; BX_ISA=" : "", env && *env ? env : "",
           env && *env ? " ignored: unknown or not supported here" : "");
  return;
#endif
  snprintf(auto_reason, sizeof auto_reason, "%s: the widest ISA this CPU runs (%s; no CPU-table rule)%s%s%s",
           auto_isa->name, who, env && *env ? "; BX_ISA=" : "", env && *env ? env : "",
           env && *env ? " ignored: unknown or not supported here" : "");
}

static void restore_auto(void) {
  pthread_once(&once, choose_once);
  atomic_store(&active_reason, auto_reason);
  atomic_store(&active, auto_isa);
}

static const isa *active_isa(void) {
  const isa *s = atomic_load_explicit(&active, memory_order_acquire);
  if (!s) {
    restore_auto(); /* idempotent: racing first calls agree */
    s = atomic_load(&active);
  }
  return s;
}

const bx_kernels *bx_kernels_active(void) { return active_isa()->kernels; }

const bx_scale_kernels *bx_scale_kernels_active(void) { return active_isa()->scale; }

const bx_gemm_kernel *bx_gemm_kernel_active(void) { return active_isa()->gemm; }

const bx_tokred_kernels *bx_tokred_kernels_active(void) { return active_isa()->tokred; }
const bx_math_kernels *bx_math_kernels_active(void) { return active_isa()->math; }

const char *bx_isa_name(void) { return active_isa()->name; }

const char *bx_kernels_reason(void) {
  active_isa();
  return atomic_load(&active_reason);
}

bx_status bx_force_isa(const char *name) {
  pthread_once(&once, choose_once);
  if (!name) {
    restore_auto();
    return BX_OK;
  }
  const isa *s = isa_named(name);
  if (!s || !runs_here(s)) return bx_fail(BX_EINVAL, "ISA '%s' is unknown or not supported by this CPU", name);
  snprintf(forced_reason, sizeof forced_reason, "%s: forced by bx_force_isa", s->name);
  atomic_store(&active_reason, forced_reason);
  atomic_store(&active, s);
  return BX_OK;
}
