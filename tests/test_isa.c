/*
 * test_isa.c — run-time dispatch: every ISA this CPU has can be forced by
 * name, unknown names are refused, and the automatic choice is the one
 * the CPU table names for this CPU, else the widest the CPU supports
 * (kernels.h, dispatch.c: avx512 F+DQ+BW+VL, avx2 AVX2+FMA+F16C), with its
 * reason. Elsewhere (aarch64) the portable table is the only one.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels.h"
#include "tests.h"

void test_isa_force_and_names(void) {
  CHECK_STATUS(bx_force_isa("portable"), BX_OK, "portable always runs");
  CHECK(strcmp(bx_isa_name(), "portable") == 0, "name after forcing: %s", bx_isa_name());
  CHECK_STATUS(bx_force_isa("sse9"), BX_EINVAL, "unknown ISA name");
  CHECK_STATUS(bx_force_isa(""), BX_EINVAL, "empty ISA name");
  CHECK(strcmp(bx_isa_name(), "portable") == 0,
        "a refused name leaves the forced ISA (%s)", bx_isa_name());
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  int has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  int has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  CHECK_STATUS(bx_force_isa("avx2"), has_avx2 ? BX_OK : BX_EINVAL, "avx2 availability");
  if (has_avx2) CHECK(strcmp(bx_isa_name(), "avx2") == 0, "name: %s", bx_isa_name());
  CHECK_STATUS(bx_force_isa("avx512"), has_avx512 ? BX_OK : BX_EINVAL, "avx512 availability");
  if (has_avx512) CHECK(strcmp(bx_isa_name(), "avx512") == 0, "name: %s", bx_isa_name());
  CHECK_STATUS(bx_force_isa(NULL), BX_OK, "back to automatic");
  if (!has_avx2 || !has_avx512)
    bxt_skip("this CPU cannot run every kernel table: the others are not tested here");
  const char *want = has_avx512 ? "avx512" : has_avx2 ? "avx2" : "portable";
  const char *why = bx_kernels_reason();
  size_t len = strlen(bx_isa_name());
  CHECK(strncmp(why, bx_isa_name(), len) == 0 && why[len] == ':',
        "the reason names the active table: \"%s\" (%s)", why, bx_isa_name());
  /* BX_ISA would override the choice; a CPU-table rule may pick another
   * table than the widest, and says so */
  if (getenv("BX_ISA") == NULL && strstr(why, "the CPU table's choice") == NULL)
    CHECK(strcmp(bx_isa_name(), want) == 0, "automatic choice %s (%s), want the widest, %s",
          bx_isa_name(), why, want);
#else
  /* no other kernel tables are built here: the x86 names are refused and
   * the automatic choice is the portable table, saying why */
  CHECK_STATUS(bx_force_isa("avx2"), BX_EINVAL, "avx2 on a CPU that is not x86-64");
  CHECK_STATUS(bx_force_isa("avx512"), BX_EINVAL, "avx512 on a CPU that is not x86-64");
  CHECK_STATUS(bx_force_isa(NULL), BX_OK, "back to automatic");
  const char *why = bx_kernels_reason();
  CHECK(strcmp(bx_isa_name(), "portable") == 0, "automatic choice %s, want portable", bx_isa_name());
  CHECK(strncmp(why, "portable:", 9) == 0 && strstr(why, "the only kernel table") != NULL,
        "the reason says portable is the only table: \"%s\"", why);
  CHECK(bxt_isa_count() == 1, "%d kernel tables can be forced here, want 1", bxt_isa_count());
#endif
  CHECK_STATUS(bx_force_isa(NULL), BX_OK, "back to automatic");
  CHECK(bxt_isa_count() >= 1, "at least the portable kernels");
}
