/*
 * bitexact_train.h — the training kernels whose bits do not depend on the
 * layout (DESIGN §9): elementwise math built from IEEE basic operations,
 * batch-invariant GEMM, the layout-invariant token reduction (canonical
 * addends on an int64 grid), and AdamW. CPU, C11; DLPack tensors; bx_
 * names; bx_status errors with bx_last_error() as in bitexact.h (the
 * conventions listed there hold here too unless a comment says otherwise).
 *
 * One header per concern, all included here: bitexact_train_math.h
 * (elementwise math, AdamW), bitexact_train_gemm.h (GEMM),
 * bitexact_train_tokred.h (token reduction, weight gradients),
 * bitexact_train_moe.h (router, dispatch), bitexact_train_layers.h
 * (RMSNorm, RoPE, SwiGLU, attention, embedding, cross-entropy).
 */
#ifndef BITEXACT_TRAIN_H
#define BITEXACT_TRAIN_H

#include "bitexact.h"
#include "bitexact_train_math.h"
#include "bitexact_train_gemm.h"
#include "bitexact_train_tokred.h"
#include "bitexact_train_moe.h"
#include "bitexact_train_layers.h"

#endif /* BITEXACT_TRAIN_H */
