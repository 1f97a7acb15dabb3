/*
 * bitexact_train.h — the training kernels whose bits do not depend on the
 * layout (DESIGN §9): elementwise math built from IEEE basic operations,
 * batch-invariant GEMM, the layout-invariant token reduction (canonical
 * addends on an int64 grid), and AdamW. CPU, C11; DLPack tensors; bx_
 * names; bx_status errors with bx_last_error() as in bitexact.h (the
 * conventions listed there hold here too unless a comment says otherwise).
 *
 * Status: being built. Each section below states what it promises.
 */
#ifndef BITEXACT_TRAIN_H
#define BITEXACT_TRAIN_H

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Elementwise math (section owner: math)
 * ==================================================================== */

/* ====================================================================== */

/* ======================================================================
 * GEMM (section owner: gemm)
 * ==================================================================== */

/* ====================================================================== */

/* ======================================================================
 * Token reduction (section owner: tokred)
 * ==================================================================== */

/* ====================================================================== */

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_TRAIN_H */
