/* fuzz_sumabs.c — bx_acc_add_abs against MPFR, every ISA (fuzz_acc.h). */
#define FZ_ABS 1
#include "fuzz_acc.h"
