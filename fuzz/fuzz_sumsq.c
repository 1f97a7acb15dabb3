/* fuzz_sumsq.c — bx_acc_add_squares against MPFR, every ISA (fuzz_acc.h). */
#define FZ_ABS 0
#include "fuzz_acc.h"
