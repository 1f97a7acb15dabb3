/*
 * train_config.h — config.json of `bitexact train` (DESIGN §10): the model
 * module's tr_config (src/glm/glm_config.h: the struct, the tiny config,
 * Glm4MoeConfig's defaults, the one range checker) read from and written
 * to transformers' config.json by train_config.c (jansson).
 */
#ifndef BX_CLI_TRAIN_CONFIG_H
#define BX_CLI_TRAIN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "glm_config.h"

/* Reads config.json at path into c (fields absent from the file take
 * Glm4MoeConfig's defaults, not the tiny config's); checks every range.
 * 0 on success; -1 with a one-line reason in err (nothing else touched). */
int tr_config_load(const char *path, tr_config *c, char *err, size_t errlen);

/* Writes c as a transformers config.json ("architectures":
 * ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "torch_dtype":
 * "float32", every field above). 0 / -1 with err. */
int tr_config_save(const tr_config *c, const char *path, char *err, size_t errlen);

/* tr_config_load from bytes (fuzz/fuzz_train_config.c, tests). */
int tr_config_parse(const char *text, size_t len, tr_config *c, char *err, size_t errlen);

#endif /* BX_CLI_TRAIN_CONFIG_H */
