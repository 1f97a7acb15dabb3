/*
 * st_write.h — a safetensors file of F32 tensors written deterministically:
 * tensors in bytewise order of their names, each right after the previous
 * one, the header compact JSON with sorted keys ({"__metadata__":
 * {"format": "pt"}}), padded with spaces to a multiple of 8 bytes; synced.
 * So the bytes depend only on the names, shapes and values.
 */
#ifndef BX_CLI_ST_WRITE_H
#define BX_CLI_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

/* One tensor to write (F32). */
typedef struct tc_tensor {
  const char *name;
  int ndim;
  const int64_t *shape;
  int64_t numel;
  const float *data;
} tc_tensor;

/* Writes a safetensors file of n F32 tensors (sorted by name; names must
 * be unique). 0 / -1 with err. */
int tc_write_safetensors(const char *path, const tc_tensor *t, size_t n, char *err, size_t errlen);

/* Test hook of the crash-consistency trials (docs/restart.md; never set in
 * a real run): with BITEXACT_TEST_CKPT_KILL=POINT[:N] in the environment,
 * the N-th time (default 1) this process reaches the checkpoint writer's
 * point POINT it kills itself with SIGKILL; BITEXACT_TEST_CKPT_STOP=POINT[:N]
 * stops itself with SIGSTOP instead (a driver then kills it, or another
 * rank). The points, in the order a save reaches them: "tmpdir" (the
 * empty DIR.tmp-XXXXXX made), "config" (config.json written), "torn"
 * (inside every safetensors file, after its header and half its tensors),
 * "model" (the model's files written), "optimizer", "state"
 * (trainer_state.json: every file written), "synced" (files and
 * directories fsynced), "renamed" (the new directory in place, the old
 * one not yet removed), "done". Without the variables: nothing. */
void tc_test_point(const char *point);

#endif /* BX_CLI_ST_WRITE_H */
