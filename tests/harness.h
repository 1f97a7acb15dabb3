/*
 * harness.h — the tiny test framework of bx_tests.
 *
 * A test is a `void test_NAME(void)` listed once in tests/tests.h (its
 * prototype) and once in the table of tests/main.c. CHECK records a failure
 * with file:line and a printf-style message and keeps going; a test passes
 * when none of its checks failed. Property tests draw their random numbers
 * from bxt_rng_init(), which is seeded from BX_TEST_SEED (or a fixed
 * default) and the test's name, so a failure is replayed with
 *   BX_TEST_SEED=<seed> build/tests/bx_tests <test name>
 * The runner's last line is `N passed, N failed` (`, N skipped` when some
 * test could not run here) and its exit status is non-zero on any failure.
 *
 * Checks are made from the main thread only (the counters are not atomic):
 * tests that run threads collect results and check them after the join.
 */
#ifndef BX_TEST_HARNESS_H
#define BX_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"
#include "rng.h"

#if defined(__GNUC__)
#define BXT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define BXT_PRINTF(a, b)
#endif

/* Records the outcome of one check; returns ok. */
int bxt_check(int ok, const char *file, int line, const char *expr,
              const char *fmt, ...) BXT_PRINTF(5, 6);

/* CHECK(cond, "format", args...): the message says what was compared. */
#define CHECK(cond, ...) \
  bxt_check(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)

/* Bitwise comparison of two doubles / floats (memcmp of the bit pattern,
 * never a tolerance). NaN results compare as NaN == NaN whatever their
 * payload only when allow_nan_payload is set. */
int bxt_check_bits_d(double got, double want, const char *file, int line,
                     const char *fmt, ...) BXT_PRINTF(5, 6);
int bxt_check_bits_f(float got, float want, const char *file, int line,
                     const char *fmt, ...) BXT_PRINTF(5, 6);
#define CHECK_BITS_D(got, want, ...) \
  bxt_check_bits_d((got), (want), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_BITS_F(got, want, ...) \
  bxt_check_bits_f((got), (want), __FILE__, __LINE__, __VA_ARGS__)

/* CHECK_STATUS(call_result, expected, "context", ...) */
int bxt_check_status(bx_status got, bx_status want, const char *file,
                     int line, const char *fmt, ...) BXT_PRINTF(5, 6);
#define CHECK_STATUS(got, want, ...) \
  bxt_check_status((got), (want), __FILE__, __LINE__, __VA_ARGS__)

/* Marks the running test as skipped (it could not run on this machine);
 * a skipped test with failed checks still counts as failed. */
void bxt_skip(const char *why);

/* Number of failed checks so far in the running test (to stop loops
 * early after the first few failures). */
int bxt_failures(void);

/* ---- deterministic random numbers (src/common/rng.h: xoshiro256**, splitmix64) --- */
typedef bx_rng bxt_rng;

/* The run's base seed (BX_TEST_SEED or the default). */
uint64_t bxt_seed(void);
/* A generator for the running test: base seed mixed with the test name. */
void bxt_rng_init(bxt_rng *r);
void bxt_rng_seed(bxt_rng *r, uint64_t seed);
uint64_t bxt_next(bxt_rng *r);
/* Uniform in [0, n), n >= 1. */
uint64_t bxt_below(bxt_rng *r, uint64_t n);
/* Uniform in [0, 1). */
double bxt_uniform(bxt_rng *r);
/* Standard normal (Box-Muller). */
double bxt_normal(bxt_rng *r);
/* Fisher-Yates shuffle of n elements of size sz. */
void bxt_shuffle(bxt_rng *r, void *base, size_t n, size_t sz);

/* ---- ISAs this CPU can run (filled before the first test) ----------- */
int bxt_isa_count(void);
const char *bxt_isa(int i);
/* Forces ISA i (or the automatic choice for i < 0); returns 1 on success. */
int bxt_force(int i);

#endif /* BX_TEST_HARNESS_H */
