/*
 * norm_internal.h — what norm.c (chunked exact pass, output) shares with
 * norm_pow.c (the other-p path).
 */
#ifndef BX_CLI_NORM_INTERNAL_H
#define BX_CLI_NORM_INTERNAL_H

#include <pthread.h>

#include <bitexact.h>

#include "cli.h"

#define CHUNK_BYTES ((uint64_t)16 << 20) /* per work item */
#define MAX_GROUPS 64

typedef enum ord_mode { ORD_SQ, ORD_ABS, ORD_MAX, ORD_MIN, ORD_NNZ, ORD_POW } ord_mode;

typedef struct shard {     /* one tensor of one file */
  size_t file;
  const st_tensor *t;
  size_t id;               /* unique-name index */
  int nonfinite;           /* set by a worker: holds NaN or Inf */
} shard;

typedef struct utensor {   /* one name, one or more shards */
  const char *name;
  size_t first, nshards;   /* into the sorted shard array */
  int included;            /* every shard is F16/BF16/F32/F64 */
  uint64_t nelem;
  int nan;                 /* EXT modes */
  double ext;
  uint64_t nnz;
  int any;                 /* EXT: at least one chunk seen */
  double norm;
} utensor;

typedef struct item {
  const uint8_t *data;
  uint64_t n;              /* elements */
  st_dtype dt;
  size_t shard;
} item;

typedef struct group_def {
  const char *name;
  const char *glob;
} group_def;

typedef struct norm_job {
  ord_mode mode;
  double ord;
  shard *shards;
  utensor *tensors;
  bx_acc *accs;            /* per unique tensor, SQ/ABS only */
  item *items;
  size_t nitems;
  atomic_size_t next;
  pthread_mutex_t lock;
  cli_progress progress;
  atomic_int failed;
  char error[1024];
  const st_file *files;
} norm_job;

/* The DLPack dtype of a F16/BF16/F32/F64 tensor. */
DLDataType norm_dl_dtype(st_dtype dt);

/* Other p (ORD_POW): one bx_total_norm over all tensors (one group per
 * name: per-tensor norms and the total), one more for the --group norms.
 * Misaligned shards are copied (*copies[s], freed by the caller). 0 or -1
 * (error printed). */
int norm_pow(norm_job *j, size_t nshard, size_t nuniq, const group_def *groups, size_t ngroups,
             int threads, int error_nonfinite, double *total, double *gnorm, void ***copies);

#endif /* BX_CLI_NORM_INTERNAL_H */
