/* model_ref.h — the fp64 reference of tests/train/model_ref.c. */
#ifndef BX_TEST_MODEL_REF_H
#define BX_TEST_MODEL_REF_H

#include <stddef.h>
#include <stdint.h>

#include "glm_config.h"

typedef struct ref_model {
  tr_config c;
  size_t n;                /* parameters and buffers */
  const char *const *names;
  double **data;           /* fp64 copies, by the same index */
} ref_model;

/* The mean cross-entropy of nseq sequences of L+1 tokens (inputs the first
 * L, targets the last L), in fp64. */
double ref_loss(const ref_model *r, const int32_t *tokens, int64_t nseq, int64_t L);

#endif /* BX_TEST_MODEL_REF_H */
