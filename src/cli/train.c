/*
 * train.c — `bitexact train`: trains the GLM-4.5 MoE model of
 * train_model.h on token data (train_data.h) with AdamW and exact-norm
 * clipping, recording every step (train_record.h) and saving / resuming
 * checkpoints (train_ckpt.h). DESIGN §10 is the contract; docs/train_cli.md
 * the manual.
 *
 * A step s, on each of the P ranks (data parallel: rank r takes the
 * consecutive slice [r*B/P, (r+1)*B/P) of the step's B global sequences):
 *   1. the local sequences' tokens (train_data.h's order);
 *   2. tr_model_grad over M micro-batches: loss, per-token losses, every
 *      parameter's gradient summed over the global batch (the same bits on
 *      every rank);
 *   3. clipping, as bx_clip_grad_norm computes it: the exact L2 norm of
 *      the gradients of the dense and the expert group (bx_total_norm; each
 *      rank passes the dense parameters i with i mod P == r and, of the
 *      experts it holds, those with i mod (P/E) == its EP group, so every
 *      element is counted once), coef = bx_clip_coef(norm, --clip) (torch's formula in
 *      double), every gradient scaled by coef with bx_scale's torch
 *      rounding unless coef == 1;
 *   4. bx_adamw_step on every parameter the rank holds, step count s + 1;
 * With --ep E (train_moe_ep.c, docs/train_cli.md): the routed experts
 * live on EP groups of E consecutive ranks, rank 0 gathers the others'
 * experts before writing a checkpoint or a gradient dump.
 *   5. the record line (rank 0).
 * Everything is checked before the first file is written: bad input gives
 * one line on stderr and exit status 2.
 */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bitexact.h>
#include <bitexact_train.h>

#include "cli.h"
#include "ckpt_model.h"
#include "train_ckpt.h"
#include "train_ckpt_model.h"
#include "train_config.h"
#include "train_data.h"
#include "train_agree.h"
#include "train_model.h"
#include "train_mpi.h"
#include "train_record.h"
#include "train_trace.h"

typedef struct tr_args {
  const char *config, *data, *record, *save, *resume, *dump_grads, *eval_data;
  const char *trace, *dump; /* --trace FILE, --dump KEY */
  const char *init_from;     /* --init-from DIR */
  uint64_t save_max_shard;   /* --save-max-shard-size (bytes; 0: one model.safetensors) */
  int64_t steps, seq_len, global_batch, micro_batches, ep;
  uint64_t seed;
  double lr, weight_decay, clip, min_lr, beta1, beta2, eps;
  bx_lr_schedule sched;
  int64_t warmup_steps, save_every, eval_every, eval_batches;
  int ordinary, shuffle, dry_run, bf16, no_history;
  int device;                /* --device: -1 cpu, N >= 0 cuda:N (the model in managed memory) */
  int have_seq_len;
  cli_opts common;
} tr_args;

static int g_rank;

/* Start-up with several ranks: a message waits for the start-up agreement (its first one
 * kept), which names the rank that prints it (docs/faults.md). */
static int g_defer;
static char g_defer_msg[900];

static void terr(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void terr(const char *fmt, ...) {
  char m[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  if (g_defer) {
    if (!g_defer_msg[0]) snprintf(g_defer_msg, sizeof g_defer_msg, "%s", m);
  } else if (g_rank == 0) {
    cli_error("%s", m);
  }
}

/* Errors every rank detects alike: printed once, by rank 0 (at start-up with several
 * ranks: by the rank the start-up agreement names). */
#define TERR(...) terr(__VA_ARGS__)

static const char usage[] =
    "usage: bitexact train [--config FILE.json] [--data FILE] [--steps N] [--seed S] "
    "[--seq-len L] [--global-batch B] [--micro-batches M] [--ep E] [--threads T] [--lr X] "
    "[--lr-scheduler constant|linear|cosine|constant_with_warmup] [--warmup-steps W] [--min-lr X] "
    "[--adam-beta1 X] [--adam-beta2 X] [--adam-epsilon X] "
    "[--weight-decay X] [--clip X] [--mode invariant|ordinary] [--compute-dtype fp32|bf16] "
    "[--grid-history on|off] [--device cpu|cuda[:N]] "
    "[--record FILE.jsonl] "
    "[--save DIR] [--save-max-shard-size SIZE] [--save-every K] [--resume DIR] [--init-from DIR] "
    "[--shuffle] [--dump-grads FILE] [--trace FILE [--dump KEY]] "
    "[--eval-data FILE --eval-every K [--eval-batches N]] [--dry-run] "
    "[--json] [-q]";

static const char *const sched_names[] = {"constant", "linear", "cosine", "constant_with_warmup"};

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < lo) {
    TERR("train: %s: '%s' is not an integer >= %lld", flag, s, (long long)lo);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_f64(const char *flag, const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end || !isfinite(v) || v < 0) {
    TERR("train: %s: '%s' is not a finite number >= 0", flag, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, tr_args *a) {
  memset(a, 0, sizeof *a);
  a->steps = 10;
  a->seq_len = 64;
  a->global_batch = 8;
  a->micro_batches = 1;
  a->ep = 1;
  a->lr = 1e-3;
  a->weight_decay = 0.01;
  a->clip = 1.0;
  bx_adamw_opts ao = BX_ADAMW_OPTS_DEFAULT;
  a->beta1 = ao.beta1;
  a->beta2 = ao.beta2;
  a->eps = ao.eps;
  a->sched = BX_LR_CONSTANT;
  a->common.progress = -1;
  a->device = -1;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    int c = cli_common_opt(argc, argv, &i, &a->common);
    if (c < 0) return -1;
    if (c > 0) continue;
    if (strcmp(f, "--shuffle") == 0) {
      a->shuffle = 1;
      continue;
    }
    if (strcmp(f, "--dry-run") == 0) {
      a->dry_run = 1;
      continue;
    }
    static const char *const valued[] = {
        "--config", "--data", "--steps", "--seed", "--seq-len", "--global-batch",
        "--micro-batches", "--ep", "--lr", "--weight-decay", "--clip", "--mode", "--compute-dtype",
        "--grid-history", "--record",
        "--save", "--resume", "--dump-grads", "--lr-scheduler", "--warmup-steps", "--min-lr",
        "--adam-beta1", "--adam-beta2", "--adam-epsilon", "--save-every", "--eval-data",
        "--eval-every", "--eval-batches", "--init-from", "--save-max-shard-size", "--trace",
        "--dump", "--device"};
    int known = 0;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= strcmp(f, valued[k]) == 0;
    if (!known) {
      TERR("train: unknown argument '%s' (%s)", f, usage);
      return -1;
    }
    if (i + 1 >= argc) {
      TERR("train: %s needs a value", f);
      return -1;
    }
    const char *v = argv[++i];
    if (strcmp(f, "--config") == 0) a->config = v;
    else if (strcmp(f, "--data") == 0) a->data = v;
    else if (strcmp(f, "--record") == 0) a->record = v;
    else if (strcmp(f, "--save") == 0) a->save = v;
    else if (strcmp(f, "--resume") == 0) a->resume = v;
    else if (strcmp(f, "--dump-grads") == 0) a->dump_grads = v;
    else if (strcmp(f, "--trace") == 0) a->trace = v;
    else if (strcmp(f, "--dump") == 0) a->dump = v;
    else if (strcmp(f, "--eval-data") == 0) a->eval_data = v;
    else if (strcmp(f, "--eval-every") == 0) {
      if (parse_i64(f, v, 1, &a->eval_every)) return -1;
    } else if (strcmp(f, "--eval-batches") == 0) {
      if (parse_i64(f, v, 1, &a->eval_batches)) return -1;
    }
    else if (strcmp(f, "--init-from") == 0) a->init_from = v;
    else if (strcmp(f, "--save-max-shard-size") == 0) {
      if (ck_parse_size(v, &a->save_max_shard)) {
        TERR("train: --save-max-shard-size: '%s' is not a size > 0 (bytes, or digits and a unit: "
             "KB, MB, GB, KiB, MiB, GiB)", v);
        return -1;
      }
    }
    else if (strcmp(f, "--steps") == 0) {
      if (parse_i64(f, v, 0, &a->steps)) return -1;
    } else if (strcmp(f, "--seed") == 0) {
      char *end;
      errno = 0;
      unsigned long long s = strtoull(v, &end, 0);
      if (!*v || *end || errno || *v == '-') {
        TERR("train: --seed: '%s' is not an integer in [0, 2^64)", v);
        return -1;
      }
      a->seed = s;
    } else if (strcmp(f, "--seq-len") == 0) {
      if (parse_i64(f, v, 1, &a->seq_len)) return -1;
      a->have_seq_len = 1;
    } else if (strcmp(f, "--global-batch") == 0) {
      if (parse_i64(f, v, 1, &a->global_batch)) return -1;
    } else if (strcmp(f, "--micro-batches") == 0) {
      if (parse_i64(f, v, 1, &a->micro_batches)) return -1;
    } else if (strcmp(f, "--ep") == 0) {
      if (parse_i64(f, v, 1, &a->ep)) return -1;
    } else if (strcmp(f, "--lr") == 0) {
      if (parse_f64(f, v, &a->lr)) return -1;
    } else if (strcmp(f, "--weight-decay") == 0) {
      if (parse_f64(f, v, &a->weight_decay)) return -1;
    } else if (strcmp(f, "--clip") == 0) {
      if (parse_f64(f, v, &a->clip)) return -1;
    } else if (strcmp(f, "--min-lr") == 0) {
      if (parse_f64(f, v, &a->min_lr)) return -1;
    } else if (strcmp(f, "--adam-epsilon") == 0) {
      if (parse_f64(f, v, &a->eps)) return -1;
    } else if (strcmp(f, "--adam-beta1") == 0 || strcmp(f, "--adam-beta2") == 0) {
      double *b = f[11] == '1' ? &a->beta1 : &a->beta2;
      if (parse_f64(f, v, b)) return -1;
      if (*b >= 1) {
        TERR("train: %s: '%s' is not below 1", f, v);
        return -1;
      }
    } else if (strcmp(f, "--warmup-steps") == 0) {
      if (parse_i64(f, v, 0, &a->warmup_steps)) return -1;
    } else if (strcmp(f, "--save-every") == 0) {
      if (parse_i64(f, v, 1, &a->save_every)) return -1;
    } else if (strcmp(f, "--lr-scheduler") == 0) {
      int k = -1;
      for (int j = 0; j < 4; j++)
        if (strcmp(v, sched_names[j]) == 0) k = j;
      if (k < 0) {
        TERR("train: --lr-scheduler: '%s' is not constant, linear, cosine or constant_with_warmup", v);
        return -1;
      }
      a->sched = (bx_lr_schedule)k;
    } else if (strcmp(f, "--mode") == 0) {
      if (strcmp(v, "invariant") == 0) a->ordinary = 0;
      else if (strcmp(v, "ordinary") == 0) a->ordinary = 1;
      else {
        TERR("train: --mode: '%s' is not invariant or ordinary", v);
        return -1;
      }
    } else if (strcmp(f, "--grid-history") == 0) {
      if (strcmp(v, "on") == 0) a->no_history = 0;
      else if (strcmp(v, "off") == 0) a->no_history = 1;
      else {
        TERR("train: --grid-history: '%s' is not on or off", v);
        return -1;
      }
    } else if (strcmp(f, "--device") == 0) {
      char *end = NULL;
      long n = 0;
      if (strcmp(v, "cpu") == 0) a->device = -1;
      else if (strcmp(v, "cuda") == 0) a->device = 0;
      else if (strncmp(v, "cuda:", 5) == 0 && v[5] >= '0' && v[5] <= '9' &&
               (n = strtol(v + 5, &end, 10)) >= 0 && n < 1024 && !*end)
        a->device = (int)n;
      else {
        TERR("train: --device: '%s' is not cpu, cuda or cuda:N", v);
        return -1;
      }
    } else if (strcmp(f, "--compute-dtype") == 0) {
      if (strcmp(v, "fp32") == 0) a->bf16 = 0;
      else if (strcmp(v, "bf16") == 0) a->bf16 = 1;
      else {
        TERR("train: --compute-dtype: '%s' is not fp32 or bf16", v);
        return -1;
      }
    }
  }
  double probe;
  if (bx_lr_at(a->sched, a->lr, a->min_lr, a->warmup_steps, a->steps, 0, &probe) != BX_OK) {
    const char *e = bx_last_error();
    const char *m = strstr(e, ": ");
    TERR("train: --lr-scheduler %s --lr %g --min-lr %g --warmup-steps %lld: %s", sched_names[a->sched],
         a->lr, a->min_lr, (long long)a->warmup_steps, m ? m + 2 : e);
    return -1;
  }
  if (a->save_every && !a->save) {
    TERR("train: --save-every needs --save DIR");
    return -1;
  }
  if (!a->eval_data != !a->eval_every) {
    TERR("train: --eval-data and --eval-every go together");
    return -1;
  }
  if (a->eval_batches && !a->eval_data) {
    TERR("train: --eval-batches needs --eval-data FILE --eval-every K");
    return -1;
  }
  if (a->init_from && a->resume) {
    TERR("train: --init-from and --resume exclude each other (--resume continues a run, "
         "--init-from starts one at step 0)");
    return -1;
  }
  if (a->save_max_shard && !a->save) {
    TERR("train: --save-max-shard-size needs --save");
    return -1;
  }
  return 0;
}

/* The rate of step s (a pure function of the step and the flags). */
static double lr_of(const tr_args *a, int64_t s) {
  double v = NAN;
  if (bx_lr_at(a->sched, a->lr, a->min_lr, a->warmup_steps, a->steps, s, &v) != BX_OK) return NAN;
  return v;
}

/* The parent directory of path exists and is writable. */
static int check_out_file(const char *flag, const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dir, W_OK) != 0) {
    TERR("train: %s %s: the directory %s does not exist or is not writable", flag, path, dir);
    return -1;
  }
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    TERR("train: %s %s: is a directory", flag, path);
    return -1;
  }
  return 0;
}

/* The layout: B sequences over P ranks, each rank's over M micro-batches;
 * the experts over EP groups of E ranks. Every rank decides alike (the
 * same arguments and config, compared over the ranks at start-up). */
static int check_layout(const tr_args *a, const tr_config *cfg, int P) {
  if (a->ep > 1 && P % a->ep != 0) {
    TERR("train: --ep %lld does not divide the %d rank%s (expert-parallel groups of %lld "
         "consecutive ranks)", (long long)a->ep, P, P > 1 ? "s" : "", (long long)a->ep);
    return -1;
  }
  if (a->ep > 1 && cfg->n_routed_experts % a->ep != 0) {
    TERR("train: --ep %lld does not divide n_routed_experts (%lld)", (long long)a->ep,
         (long long)cfg->n_routed_experts);
    return -1;
  }
  if (a->global_batch % P != 0) {
    TERR("train: --global-batch %lld does not divide over %d data-parallel ranks",
         (long long)a->global_batch, P);
    return -1;
  }
  int64_t local = a->global_batch / P;
  if (local % a->micro_batches != 0) {
    TERR("train: --micro-batches %lld does not divide the %lld sequences of each rank "
         "(--global-batch %lld over %d ranks)",
         (long long)a->micro_batches, (long long)local, (long long)a->global_batch, P);
    return -1;
  }
  return 0;
}

static int same_config(const tr_config *x, const tr_config *y) {
  return x->vocab_size == y->vocab_size && x->hidden_size == y->hidden_size &&
         x->intermediate_size == y->intermediate_size &&
         x->moe_intermediate_size == y->moe_intermediate_size &&
         x->num_hidden_layers == y->num_hidden_layers &&
         x->num_attention_heads == y->num_attention_heads &&
         x->num_key_value_heads == y->num_key_value_heads && x->head_dim == y->head_dim &&
         x->max_position_embeddings == y->max_position_embeddings &&
         x->attention_bias == y->attention_bias && x->use_qk_norm == y->use_qk_norm &&
         x->partial_rotary_factor == y->partial_rotary_factor && x->rope_theta == y->rope_theta &&
         x->rms_norm_eps == y->rms_norm_eps && x->first_k_dense_replace == y->first_k_dense_replace &&
         x->n_routed_experts == y->n_routed_experts &&
         x->num_experts_per_tok == y->num_experts_per_tok &&
         x->n_shared_experts == y->n_shared_experts && x->n_group == y->n_group &&
         x->topk_group == y->topk_group && x->norm_topk_prob == y->norm_topk_prob &&
         x->routed_scaling_factor == y->routed_scaling_factor &&
         x->initializer_range == y->initializer_range &&
         x->tie_word_embeddings == y->tie_word_embeddings &&
         strcmp(x->hidden_act, y->hidden_act) == 0;
}

static int load_config(const tr_args *a, tr_config *cfg) {
  char err[512];
  tr_config given;
  if (a->config && tr_config_load(a->config, &given, err, sizeof err)) {
    TERR("train: %s: %s", a->config, err);
    return -1;
  }
  if (a->resume || a->init_from) {
    const char *flag = a->resume ? "--resume" : "--init-from", *dir = a->resume ? a->resume : a->init_from;
    if (tc_load_config(dir, cfg, err, sizeof err)) {
      TERR("train: %s: %s", flag, err);
      return -1;
    }
    if (a->config && !same_config(&given, cfg)) {
      TERR("train: %s differs from the config.json of the checkpoint %s", a->config, dir);
      return -1;
    }
    return 0;
  }
  if (a->config) *cfg = given;
  else {
    tr_config_tiny(cfg);
    if (tr_config_check(cfg, err, sizeof err)) {
      TERR("train: the built-in config: %s", err);
      return -1;
    }
  }
  return 0;
}

static const char *kind_name(td_kind k) { return k == TD_NPY ? "npy" : k == TD_BIN ? "bin" : "synthetic"; }

/* The checkpoint's run is this run's (else bits would not continue). */
static int check_resume(const tr_args *a, const tc_state *st, const td_data *d) {
  const char *what = NULL;
  char got[64] = "", want[64] = "";
  if (st->seed != a->seed) what = "--seed", snprintf(got, 64, "%llu", (unsigned long long)a->seed),
                           snprintf(want, 64, "%llu", (unsigned long long)st->seed);
  else if (st->seq_len != a->seq_len) what = "--seq-len", snprintf(got, 64, "%lld", (long long)a->seq_len),
                                      snprintf(want, 64, "%lld", (long long)st->seq_len);
  else if (st->global_batch != a->global_batch)
    what = "--global-batch", snprintf(got, 64, "%lld", (long long)a->global_batch),
    snprintf(want, 64, "%lld", (long long)st->global_batch);
  else if (st->shuffle != a->shuffle) what = "--shuffle", snprintf(got, 64, "%s", a->shuffle ? "on" : "off"),
                                      snprintf(want, 64, "%s", st->shuffle ? "on" : "off");
  else if (strcmp(st->data_kind, kind_name(d->kind)) != 0 || st->data_tokens != d->ntokens)
    what = "--data", snprintf(got, 64, "%s of %lld tokens", kind_name(d->kind), (long long)d->ntokens),
    snprintf(want, 64, "%s of %lld tokens", st->data_kind, (long long)st->data_tokens);
  else if (strcmp(st->compute_dtype, a->bf16 ? "bf16" : "fp32") != 0)
    what = "--compute-dtype", snprintf(got, 64, "%s", a->bf16 ? "bf16" : "fp32"),
    snprintf(want, 64, "%s", st->compute_dtype);
  else if (st->data_position != st->step * st->global_batch)
    what = "data position", snprintf(got, 64, "%lld", (long long)st->data_position),
    snprintf(want, 64, "%lld", (long long)(st->step * st->global_batch));
  if (what) {
    TERR("train: --resume %s: %s is %s here but %s in the checkpoint", a->resume, what, got, want);
    return -1;
  }
  if (a->steps < st->step) {
    TERR("train: --steps %lld is before the checkpoint's step %lld (--steps is the step the run "
         "ends at)",
         (long long)a->steps, (long long)st->step);
    return -1;
  }
  if (st->lr != a->lr || st->weight_decay != a->weight_decay || st->clip != a->clip ||
      st->beta1 != a->beta1 || st->beta2 != a->beta2 || st->eps != a->eps ||
      st->min_lr != a->min_lr || st->warmup_steps != a->warmup_steps ||
      strcmp(st->lr_scheduler, sched_names[a->sched]) != 0 ||
      strcmp(st->mode, a->ordinary ? "ordinary" : "invariant") != 0)
    if (g_rank == 0)
      cli_note("train: --lr, --lr-scheduler, --warmup-steps, --min-lr, --adam-*, --weight-decay, "
               "--clip or --mode differ from the checkpoint's; the run continues with the new values");
  if ((a->sched == BX_LR_LINEAR || a->sched == BX_LR_COSINE) && st->total_steps != a->steps &&
      g_rank == 0)
    cli_note("train: --steps %lld is not the checkpoint's run length %lld: the %s schedule's "
             "length is --steps, so the rates from here on differ from that run's",
             (long long)a->steps, (long long)st->total_steps, sched_names[a->sched]);
  return 0;
}

static DLTensor view(float *p, const tr_param *q, DLDevice dev) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.device = dev;
  t.ndim = q->ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = (int64_t *)q->shape;
  return t;
}

/* The worst of a flag over the ranks (0 everywhere: 0). */
static int any_rank(const bx_comm *comm, int flag) {
  if (!comm) return flag;
  int64_t v = flag;
  if (comm->allreduce_i64(&v, 1, BX_OP_MAX, comm->ctx) != 0) return 1;
  return (int)v;
}

typedef struct tr_run {
  tr_args a;
  tr_config cfg;
  td_data data;
  tr_model *model;
  tr_param *params;
  size_t nparams;
  int rank, P;
  const bx_comm *comm;
  int64_t start;
  FILE *record;
  int64_t lines; /* record lines written */
  /* per step */
  int32_t *tokens;
  float *tok_loss, *all_loss;
  int64_t *words;
  DLTensor *grads, *owned[2];
  size_t nowned[2];
  float first_loss, last_loss;
  double last_norm;
  double t_first, t_rest; /* wall seconds of the first step run, of the steps after it */
  double last_lr;
  float last_eval;        /* NaN: no eval yet */
  int64_t saved_step;     /* the step of the last checkpoint written (-1: none) */
  int64_t end;            /* the step the run ends at (--steps, or earlier on a signal) */
  int stopped;            /* ended by SIGTERM / SIGINT */
  tr_ep ep;                       /* expert parallelism (size 1: none) */
  td_data eval;                   /* --eval-data (opened when given) */
  int32_t *eval_tokens;           /* one eval batch's local sequences */
  float *eval_parts;              /* every local eval sequence's loss sum */
  tt_trace *trace;                /* --trace (NULL: none) */
  /* the step's failure on this rank so far (docs/faults.md): lvl 0 none, 1 another rank's
   * (learned from an agreement), 2 this rank's own, 3 this rank's tokens gave a non-finite
   * loss; msg the first message of the highest level, printed by the rank the agreement
   * names (the highest level, then the lowest rank) */
  int lvl;
  char msg[900];
  int64_t cur_step;               /* the step run (the fault injection's clock) */
  int line_written;               /* run_step wrote the step's record line */
  tf_fault fault;                 /* BITEXACT_FAULT (test-only) */
} tr_run;

/* Records this rank's failure (kept: the first message of the highest level). */
static void step_fail(tr_run *r, int lvl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void step_fail(tr_run *r, int lvl, const char *fmt, ...) {
  if (lvl <= r->lvl) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
  r->lvl = lvl;
}

/* This rank's status as one word whose MAX over the ranks names the failure to report: the
 * highest level, then the lowest rank (0: no failure). */
static int64_t status_word(const tr_run *r) {
  const int64_t top = (int64_t)1 << 40;
  return r->lvl ? ((int64_t)r->lvl << 40) | (top - 1 - r->rank) : 0;
}

/* The agreed word v: 0 when no rank failed; else 1, the named rank prints its one line
 * ("train: rank R: ..." with several ranks) and every rank gives up the step. */
static int decide(tr_run *r, int64_t v) {
  if (v == 0) return 0;
  const int64_t top = (int64_t)1 << 40;
  int who = (int)(top - 1 - (v & (top - 1)));
  if (who == r->rank) {
    if (r->P > 1) cli_error("train: rank %d: %s", who, r->msg);
    else cli_error("train: %s", r->msg);
  }
  r->lvl = 0;
  return 1;
}

/* An agreement of its own (one MAX all-reduce of one word) where no collective of the
 * step carries the status: 1 when some rank failed (reported), 0 otherwise. */
static int agree_now(tr_run *r) {
  int64_t v = status_word(r);
  if (r->comm && r->comm->allreduce_i64(&v, 1, BX_OP_MAX, r->comm->ctx) != 0) {
    cli_error("train: rank %d: the ranks' agreement (an all-reduce) failed", r->rank);
    return 1;
  }
  return decide(r, v);
}

/* The test-only fault of this rank at this step and point (fires once). */
static int fault_at(tr_run *r, const char *point) {
  return tf_hit(&r->fault, r->rank, r->cur_step, point);
}

/* The model's fault hook (tr_run_opts.fault). */
static int fault_hook(void *ctx, const char *point) { return fault_at((tr_run *)ctx, point); }

/* The eval's: its routed experts' fault point is "eval". */
static int eval_fault_hook(void *ctx, const char *point) {
  return strcmp(point, "kernel") == 0 && fault_at((tr_run *)ctx, "eval");
}

/* Whether this rank holds parameter q (every dense one; its experts). */
static int holds(const tr_run *r, const tr_param *q) {
  return q->group != TR_GROUP_EXPERT || tr_ep_holds(&r->ep, r->cfg.n_routed_experts, q->expert);
}

/* Rank 0 gets the experts it does not hold from EP group 0 (world rank d
 * = EP rank d): field 0 grad, 1 data + AdamW state. Every rank calls it. */
static int gather_experts(tr_run *r, int what) {
  if (r->ep.size <= 1) return 0;
  int bad = 0;
  int64_t nl = r->cfg.n_routed_experts / r->ep.size;
  for (size_t i = 0; i < r->nparams; i++) {
    tr_param *q = &r->params[i];
    if (q->group != TR_GROUP_EXPERT) continue;
    int src = (int)(q->expert / nl);
    size_t b = (size_t)q->numel * sizeof(float);
    if (what == 0) bad |= trm_to_root(q->grad, b, src) != 0;
    else
      bad |= trm_to_root(q->data, b, src) != 0 || trm_to_root(q->exp_avg, b, src) != 0 ||
             trm_to_root(q->exp_avg_sq, b, src) != 0;
  }
  return any_rank(r->comm, bad);
}

/* Whether this rank writes parameter q's trace entries: rank 0 the dense
 * ones, the EP rank of EP group 0 that holds an expert its own (the ranks
 * gather_experts reads from). */
static int traces(const tr_run *r, const tr_param *q) {
  if (q->group != TR_GROUP_EXPERT || r->ep.size <= 1) return r->rank == 0;
  return r->rank == (int)(q->expert / (r->cfg.n_routed_experts / r->ep.size));
}

/* The trace entries of every trainable parameter's gradient (phase 1) or
 * value (phase 2) this rank writes. 0 / -1 (printed). */
static int trace_params(tr_run *r, int phase, int64_t s) {
  for (size_t i = 0; i < r->nparams; i++) {
    const tr_param *q = &r->params[i];
    if (q->group < 0 || !traces(r, q)) continue;
    /* the gradients in the reverse of the parameters' order (roughly the order the backward
     * produces them: the LM head's first), the updated values in their order */
    int64_t order = phase == 1 ? (int64_t)(r->nparams - 1 - i) : (int64_t)i;
    if (tt_tensor(r->trace, phase, q->name, phase == 1 ? "grad" : "param", order,
                  phase == 1 ? q->grad : q->data, q->ndim, q->shape)) {
      (void)s;
      return -1; /* out of memory: the caller reports it */
    }
  }
  return 0;
}

static int write_grads(tr_run *r, char *err, size_t errlen) {
  tc_tensor *t = calloc(r->nparams + 1, sizeof *t);
  size_t m = 0;
  if (!t) return snprintf(err, errlen, "out of memory"), -1;
  for (size_t i = 0; i < r->nparams; i++)
    if (r->params[i].group >= 0)
      t[m++] = (tc_tensor){r->params[i].name, r->params[i].ndim, r->params[i].shape,
                           r->params[i].numel, r->params[i].grad};
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", r->a.dump_grads, (int)getpid());
  int rc = tc_write_safetensors(tmp, t, m, err, errlen);
  if (rc == 0 && rename(tmp, r->a.dump_grads) != 0) {
    snprintf(err, errlen, "%s: cannot rename into place: %s", r->a.dump_grads, strerror(errno));
    rc = -1;
  }
  if (rc) unlink(tmp);
  free(t);
  return rc;
}

/* The exact mean loss over the eval sequences (batches j = 0 .. N-1 of B
 * sequences in file order, rank r taking the slice of each batch its
 * training batches have), of the model as it is: each sequence's loss sum
 * (tr_model_eval: a chunk of one sequence, as the training loss) added
 * onto the agreed grid of a token reduction over all N B L tokens,
 * summed over the ranks, divided by N B L and rounded once: the same
 * bits on every layout. 0 / -1 (the message printed). */
static int run_eval(tr_run *r, float *mean) {
  const tr_args *a = &r->a;
  int64_t B = a->global_batch, L = a->seq_len, local = B / r->P, first = r->rank * local;
  int64_t N = a->eval_batches;
  char err[512];
  tr_run_opts ro = {cli_threads(&a->common), a->ordinary ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID, L,
                    a->bf16, a->no_history, NULL, r->fault.on ? eval_fault_hook : NULL, r};
  for (int64_t j = 0; j < N && !r->lvl; j++) {
    for (int64_t b = 0; b < local; b++)
      td_tokens(&r->eval, j * B + first + b, r->eval_tokens + b * (L + 1));
    int e = tr_model_eval(r->model, &ro, r->eval_tokens, local, j * B + first, a->micro_batches,
                          r->eval_parts + j * local, err, sizeof err);
    if (e) step_fail(r, e == -2 ? 1 : 2, "--eval-data %s: %s", a->eval_data, err);
  }
  if (agree_now(r)) return -1;
  if (tr_eval_mean(r->eval_parts, N * local, local, B, first, L, N * B * L, r->comm, mean, err,
                   sizeof err)) {
    TERR("train: --eval-data %s: the eval loss: %s", a->eval_data, err);
    return -1;
  }
  return 0;
}

/* One step on this rank. A rank that fails locally goes on to the step's next agreement
 * (docs/faults.md): inside tr_model_grad, the token losses' all-reduce (its status words),
 * one of its own before the trace's gather, the eval and after a gradient dump, or the
 * loop's after the step. 1: a failure was agreed here (every rank returns 1 alike); 0:
 * the step ran, or failed with r->lvl set for the loop's agreement. The record line
 * (rank 0) is written last; *rec_pos: the record's length before it. */
static int run_step(tr_run *r, int64_t s, long *rec_pos) {
  const tr_args *a = &r->a;
  int64_t B = a->global_batch, L = a->seq_len, local = B / r->P, first = r->rank * local;
  char err[512];
  r->lvl = 0;
  r->cur_step = s;
  for (int64_t b = 0; b < local && !r->lvl; b++) {
    int64_t i = td_sequence(&r->data, s * B + first + b);
    if (i < 0) step_fail(r, 2, "step %lld: out of memory for the data permutation", (long long)s);
    else td_tokens(&r->data, i, r->tokens + b * (L + 1));
  }
  if (!r->lvl && fault_at(r, "data")) r->tokens[1] = (int32_t)r->cfg.vocab_size; /* a bad id read */
  tr_run_opts ro = {cli_threads(&a->common), a->ordinary ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID, L, a->bf16,
                    a->no_history, NULL, r->fault.on ? fault_hook : NULL, r};
  if (r->trace) {
    tt_begin_step(r->trace, s);
    ro.trace = tt_hook(r->trace);
  }
  float loss = NAN;
  memset(r->tok_loss, 0, (size_t)(local * L) * sizeof *r->tok_loss);
  /* a rank that failed already takes part with no tokens: tr_model_grad fails it before its
   * first collective, agreed there */
  int g = tr_model_grad(r->model, &ro, r->lvl ? NULL : r->tokens, local, first, B, a->micro_batches,
                        r->comm, &loss, r->tok_loss, err, sizeof err);
  if (g) step_fail(r, g == -2 ? 1 : 2, "step %lld: %s", (long long)s, err);
  for (int64_t k = 0; k < local * L; k++) /* the cause, when this rank's tokens gave it */
    if (!isfinite(r->tok_loss[k])) {
      step_fail(r, 3, "step %lld: non-finite loss (%g) at token %lld of global sequence %lld "
                "(this rank's local sequence %lld)", (long long)s, (double)r->tok_loss[k],
                (long long)(k % L), (long long)(first + k / L), (long long)(k / L));
      break;
    }
  if (!r->lvl && r->trace && trace_params(r, 1, s)) /* the gradients before clipping */
    step_fail(r, 2, "step %lld: --trace: out of memory", (long long)s);
  /* the per-token losses of the global batch, in global token order; the words carry every
   * rank's status (one word each, in its slot) */
  const float *all = r->tok_loss;
  if (r->P > 1) {
    size_t nw = (size_t)(B * L) + (size_t)r->P;
    memset(r->words, 0, nw * sizeof *r->words);
    for (int64_t k = 0; !r->lvl && k < local * L; k++) {
      uint32_t u;
      memcpy(&u, &r->tok_loss[k], 4);
      r->words[first * L + k] = u;
    }
    r->words[B * L + r->rank] = status_word(r);
    if (r->comm->allreduce_i64(r->words, nw, BX_OP_SUM, r->comm->ctx) != 0) {
      cli_error("train: rank %d: step %lld: the all-reduce of the token losses failed", r->rank,
                (long long)s);
      return 1;
    }
    int64_t v = 0;
    for (int k = 0; k < r->P; k++) v = r->words[B * L + k] > v ? r->words[B * L + k] : v;
    if (decide(r, v)) return 1;
    for (int64_t k = 0; k < B * L; k++) {
      uint32_t u = (uint32_t)r->words[k];
      memcpy(&r->all_loss[k], &u, 4);
    }
    all = r->all_loss;
  } else if (decide(r, status_word(r))) {
    return 1;
  }
  if (a->dump_grads && s == a->steps - 1) {
    if (gather_experts(r, 0)) step_fail(r, 2, "--dump-grads: gathering the experts failed");
    else if (r->rank == 0 && write_grads(r, err, sizeof err))
      step_fail(r, 2, "--dump-grads %s", err);
    if (agree_now(r)) return 1;
  }
  /* clipping (as bx_clip_grad_norm, with the group norms): the norm agrees its own failures */
  bx_group groups[2] = {{r->owned[0], r->nowned[0]}, {r->owned[1], r->nowned[1]}};
  bx_norm_opts no = BX_NORM_OPTS_DEFAULT;
  no.num_threads = ro.threads;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  double total = NAN, gn[2] = {NAN, NAN}, coef = 1;
  bx_status st = bx_total_norm(groups, 2, r->comm, &no, &total, gn);
  if (st == BX_OK) st = bx_clip_coef(total, a->clip, &co, &coef);
  if (st == BX_OK && coef != 1) {
    bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
    so.num_threads = ro.threads;
    size_t ng = 0;
    for (size_t i = 0; i < r->nparams; i++)
      if (r->params[i].group >= 0 && holds(r, &r->params[i]))
        r->grads[ng++] = view(r->params[i].grad, &r->params[i], tr_model_device(r->model));
    st = bx_scale(r->grads, ng, coef, &so);
  }
  if (st != BX_OK)
    step_fail(r, 2, "step %lld: clipping: %s: %s", (long long)s, bx_status_str(st), bx_last_error());
  /* AdamW */
  bx_adamw_opts ao = BX_ADAMW_OPTS_DEFAULT;
  ao.lr = lr_of(a, s);
  ao.beta1 = a->beta1;
  ao.beta2 = a->beta2;
  ao.eps = a->eps;
  ao.weight_decay = a->weight_decay;
  ao.num_threads = ro.threads;
  const DLDevice dev = tr_model_device(r->model);
  for (size_t i = 0; i < r->nparams && !r->lvl; i++) {
    tr_param *q = &r->params[i];
    if (q->group < 0 || !holds(r, q)) continue; /* another rank's expert */
    DLTensor p = view(q->data, q, dev), gt = view(q->grad, q, dev), m = view(q->exp_avg, q, dev),
             v = view(q->exp_avg_sq, q, dev);
    st = bx_adamw_step(&p, &gt, &m, &v, s + 1, &ao);
    if (st != BX_OK)
      step_fail(r, 2, "step %lld: AdamW on %s: %s: %s", (long long)s, q->name, bx_status_str(st),
                bx_last_error());
  }
  /* after every --eval-every K-th step and after the run's last */
  int eval_now = a->eval_data && ((s + 1) % a->eval_every == 0 || s + 1 == a->steps);
  if (!r->lvl && r->trace && trace_params(r, 2, s))
    step_fail(r, 2, "step %lld: --trace: out of memory", (long long)s);
  if ((r->trace || eval_now) && agree_now(r)) return 1; /* before their collectives */
  if (r->trace) {
    err[0] = 0;
    if (tt_end_step(r->trace, r->P, r->comm, err, sizeof err)) {
      step_fail(r, 2, "step %lld: --trace %s: %s", (long long)s, a->trace, err[0] ? err : "cannot write");
      if (agree_now(r)) return 1;
    }
  }
  if (s == r->start) r->first_loss = loss;
  r->last_loss = loss;
  r->last_norm = total;
  trec_step rec = {s, loss, total, gn[0], gn[1], coef, ao.lr, B * L,
                   trec_loss_hash(all, (size_t)(B * L)), r->data.entropy_nats, a->bf16 ? "bf16" : "fp32",
                   tr_model_last_passes(r->model), 0, NAN};
  if (eval_now) {
    if (run_eval(r, &rec.eval_loss)) return 1;
    rec.has_eval = 1;
    r->last_eval = rec.eval_loss;
  }
  *rec_pos = r->record ? ftell(r->record) : -1;
  if (!r->lvl && r->record && trec_write(r->record, &rec) != 0)
    step_fail(r, 2, "--record %s: cannot write", a->record);
  r->line_written = !r->lvl && r->record;
  if (r->line_written) r->lines++;
  r->last_lr = ao.lr;
  return 0;
}

/* The progress line (rank 0, a terminal or --progress; not with -q):
 * step, loss, tokens/s over the steps so far, the time left. */
static void progress_line(tr_run *r, int64_t s, double elapsed) {
  const tr_args *a = &r->a;
  if (r->rank != 0 || a->common.quiet || !(a->common.progress == 1 || (a->common.progress < 0 && isatty(2))))
    return;
  int64_t done = s + 1 - r->start, left = a->steps - s - 1;
  double per = done > 0 ? elapsed / (double)done : 0, tps = per > 0 ? (double)(a->global_batch * a->seq_len) / per : 0;
  double eta = per * (double)left;
  fprintf(stderr, "bitexact: train: step %lld/%lld loss %.6f grad_norm %.4g lr %.3g %.0f tokens/s ETA %dh%02dm%02ds%s\n",
          (long long)s, (long long)a->steps, (double)r->last_loss, r->last_norm, r->last_lr, tps,
          (int)(eta / 3600), (int)(eta / 60) % 60, (int)eta % 60, left ? "" : " (done)");
}

/* The checkpoint of the state after step end - 1 into --save DIR
 * (atomic: DIR holds the previous complete checkpoint until the new one is
 * in place). Every rank calls it; the records written so far are flushed
 * first, so they never lag the checkpoint. 0 / -1 (the message printed). */
static int save_checkpoint(tr_run *r, int64_t end) {
  const tr_args *a = &r->a;
  char err[512];
  r->lvl = 0;
  r->cur_step = end - 1; /* the fault clock: the save after step end - 1 */
  if (r->record && fflush(r->record) != 0) step_fail(r, 2, "--record %s: cannot write", a->record);
  if (r->rank != 0 && fault_at(r, "save"))
    step_fail(r, 2, "--save %s: this rank's part of the checkpoint of step %lld failed: injected "
              "fault (BITEXACT_FAULT)", a->save, (long long)end);
  if (agree_now(r)) return -1;
  if (gather_experts(r, 1)) {
    TERR("train: --save: gathering the experts failed");
    return -1;
  }
  if (r->rank == 0) {
    tc_state st;
    memset(&st, 0, sizeof st);
    st.step = end;
    st.seed = a->seed;
    st.seq_len = a->seq_len;
    st.global_batch = a->global_batch;
    st.shuffle = a->shuffle;
    snprintf(st.data_kind, sizeof st.data_kind, "%s", kind_name(r->data.kind));
    st.data_tokens = r->data.ntokens;
    st.data_sequences = r->data.nseq;
    st.data_position = end * a->global_batch;
    st.lr = a->lr;
    snprintf(st.lr_scheduler, sizeof st.lr_scheduler, "%s", sched_names[a->sched]);
    st.warmup_steps = a->warmup_steps;
    st.total_steps = a->steps;
    st.min_lr = a->min_lr;
    st.beta1 = a->beta1;
    st.beta2 = a->beta2;
    st.eps = a->eps;
    st.weight_decay = a->weight_decay;
    st.clip = a->clip;
    snprintf(st.mode, sizeof st.mode, "%s", a->ordinary ? "ordinary" : "invariant");
    snprintf(st.compute_dtype, sizeof st.compute_dtype, "%s", a->bf16 ? "bf16" : "fp32");
    st.history = (int *)(uintptr_t)tr_model_history(r->model, &st.nhistory);
    if (!st.history) st.nhistory = 0;
    if (fault_at(r, "save"))
      step_fail(r, 2, "--save %s: writing the checkpoint of step %lld failed: injected fault "
                "(BITEXACT_FAULT)", a->save, (long long)end);
    else if (tc_save_shards(a->save, &r->cfg, r->params, r->nparams, &st, a->save_max_shard, err,
                            sizeof err) != 0)
      step_fail(r, 2, "--save %s", err);
  }
  if (agree_now(r)) return -1;
  r->saved_step = end;
  return 0;
}

/* SIGTERM / SIGINT: the step in progress finishes on every rank (the flag
 * is agreed after each step), the checkpoint is saved, exit 0. The handler
 * is one-shot (SA_RESETHAND): a second signal ends the process at once. */
static volatile sig_atomic_t g_stop;
static void on_stop_signal(int sig) { g_stop = sig; }

static void catch_stop_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

/* --dry-run: the plan and the data order, nothing computed or written. */
static void dry_run(tr_run *r) {
  const tr_args *a = &r->a;
  FILE *out = cli_out();
  int64_t B = a->global_batch;
  fprintf(out, "{\"params\": %lld, \"data\": {\"kind\": \"%s\", \"tokens\": %lld, \"sequences\": %lld",
          (long long)tr_config_param_count(&r->cfg), kind_name(r->data.kind),
          (long long)r->data.ntokens, (long long)r->data.nseq);
  if (!isnan(r->data.entropy_nats)) {
    char h[40];
    cli_hex(r->data.entropy_nats, h, sizeof h);
    fprintf(out, ", \"entropy_rate\": \"%s\", \"entropy_bits\": %.17g", h, r->data.entropy_bits);
  }
  fprintf(out, "}, \"ranks\": %d, \"first_step\": %lld, \"steps\": %lld, \"order\": [", r->P,
          (long long)r->start, (long long)a->steps);
  int64_t shown = 0;
  for (int64_t s = r->start; s < a->steps && shown < 1000; s++, shown++) {
    fprintf(out, "%s[", shown ? ", " : "");
    for (int64_t b = 0; b < B; b++)
      fprintf(out, "%s%lld", b ? ", " : "", (long long)td_sequence(&r->data, s * B + b));
    fputc(']', out);
  }
  fprintf(out, "]}\n");
}

static void summary(tr_run *r) {
  const tr_args *a = &r->a;
  FILE *out = cli_out();
  char fl[40], ll[40], gn[40], en[40], ev[40];
  cli_hex(r->last_eval, ev, sizeof ev);
  cli_hex(r->first_loss, fl, sizeof fl);
  cli_hex(r->last_loss, ll, sizeof ll);
  cli_hex(r->last_norm, gn, sizeof gn);
  cli_hex(r->data.entropy_nats, en, sizeof en);
  int64_t ran = r->end - r->start;
  char dev[32], calls[2048];
  if (a->device >= 0) snprintf(dev, sizeof dev, "cuda:%d", a->device);
  else snprintf(dev, sizeof dev, "cpu");
  if (bx_train_device_calls(calls, sizeof calls) > sizeof calls) calls[0] = 0; /* never: 64 names */
  if (a->common.json) {
    fprintf(out,
            "{\"steps_run\": %lld, \"first_step\": %lld, \"first_loss\": \"%s\", \"last_loss\": "
            "\"%s\", \"last_grad_norm\": \"%s\", \"entropy_rate\": \"%s\", \"ranks\": %d, "
            "\"params\": %lld, \"ep\": %d, \"alltoall_bytes_per_step\": %lld, "
            "\"allreduce_bytes_per_step\": %lld, \"allreduce_replica_bytes_per_step\": %lld, "
            "\"first_step_seconds\": %.6f, \"step_seconds\": %.6f, \"stopped_by_signal\": %s, "
            "\"last_eval_loss\": \"%s\", \"device\": \"%s\", \"device_calls\": {",
            (long long)ran, (long long)r->start, fl, ll, gn, en, r->P,
            (long long)tr_config_param_count(&r->cfg), r->ep.size, (long long)r->ep.a2a_bytes,
            (long long)(8 * r->ep.ar_world_words), (long long)(8 * r->ep.ar_replica_words),
            ran > 0 ? r->t_first : 0.0, ran > 1 ? r->t_rest / (double)(ran - 1) : 0.0,
            r->stopped ? "true" : "false", ev, dev);
    /* "name count" lines -> "name": count */
    for (char *l = calls, *nl; *l; l = nl + 1) {
      if (!(nl = strchr(l, '\n'))) break;
      char *sp = memchr(l, ' ', (size_t)(nl - l));
      if (sp) fprintf(out, "%s\"%.*s\": %.*s", l == calls ? "" : ", ", (int)(sp - l), l,
                      (int)(nl - sp - 1), sp + 1);
    }
    fprintf(out, "}}\n");
    return;
  }
  fprintf(out, "train: %lld steps (%lld..%lld), %lld sequences of %lld tokens per step, %d rank%s, "
          "mode %s, %lld parameters\n",
          (long long)ran, (long long)r->start, (long long)(r->end - 1), (long long)a->global_batch,
          (long long)a->seq_len, r->P, r->P > 1 ? "s" : "", a->ordinary ? "ordinary" : "invariant",
          (long long)tr_config_param_count(&r->cfg));
  if (ran > 0 && r->P > 1)
    fprintf(out, "communication per step (rank 0): --ep %d, all-to-all %lld bytes sent, "
            "token-reduction all-reduce %lld bytes over all ranks + %lld bytes over the expert "
            "replicas\n",
            r->ep.size, (long long)r->ep.a2a_bytes, (long long)(8 * r->ep.ar_world_words),
            (long long)(8 * r->ep.ar_replica_words));
  if (ran > 0)
    fprintf(out, "loss: first %.6f (%s), last %.6f (%s); grad_norm %.6g\n", (double)r->first_loss,
            fl, (double)r->last_loss, ll, r->last_norm);
  if (!isnan(r->data.entropy_nats))
    fprintf(out, "synthetic corpus: entropy rate %.6f nats (%s; %.6f bits): the lowest loss\n",
            r->data.entropy_nats, en, r->data.entropy_bits);
  if (!isnan(r->last_eval)) fprintf(out, "eval loss (last): %.6f (%s)\n", (double)r->last_eval, ev);
  if (r->stopped)
    fprintf(out, "stopped by a signal after step %lld (of --steps %lld)%s\n", (long long)(r->end - 1),
            (long long)a->steps, a->save ? "; the checkpoint holds that step: --resume continues" : "");
  if (a->device >= 0) { /* which calls ran on the device (the rest ran on the host: docs/cuda.md) */
    for (char *l = calls; *l; l++)
      if (*l == '\n') *l = l[1] ? ',' : 0;
    fprintf(out, "device: %s; calls run there (rank 0): %s\n", dev, calls[0] ? calls : "none");
  }
  if (a->record) fprintf(out, "record: %s\n", a->record);
  if (a->save) fprintf(out, "checkpoint: %s\n", a->save);
  if (a->dump_grads && ran > 0 && !r->stopped)
    fprintf(out, "gradients of step %lld: %s\n", (long long)(a->steps - 1), a->dump_grads);
}

/* Start-up, this rank alone: the flags, the config, the data and the outputs checked.
 * 0 / -1 (the message given to TERR). */
static int startup_local(tr_run *r, int argc, char **argv) {
  tr_args *a = &r->a;
  char err[512];
  if (parse_args(argc, argv, a)) return -1;
  if (load_config(a, &r->cfg)) return -1;
  if (!a->have_seq_len && a->seq_len > r->cfg.max_position_embeddings)
    a->seq_len = r->cfg.max_position_embeddings;
  if (a->seq_len > r->cfg.max_position_embeddings) {
    TERR("train: --seq-len %lld exceeds max_position_embeddings (%lld)", (long long)a->seq_len,
         (long long)r->cfg.max_position_embeddings);
    return -1;
  }
  if (check_layout(a, &r->cfg, r->P)) return -1;
  if (td_open(&r->data, a->data, r->cfg.vocab_size, a->seq_len, a->seed, a->shuffle, err, sizeof err)) {
    TERR("train: %s: %s", a->data ? a->data : "the synthetic corpus", err);
    return -1;
  }
  if (a->eval_data) {
    if (td_open(&r->eval, a->eval_data, r->cfg.vocab_size, a->seq_len, a->seed, 0, err, sizeof err)) {
      TERR("train: --eval-data %s: %s", a->eval_data, err);
      return -1;
    }
    int64_t whole = r->eval.nseq / a->global_batch;
    if (whole < 1) {
      TERR("train: --eval-data %s: %lld sequences of %lld + 1 tokens, fewer than one batch of "
           "--global-batch %lld", a->eval_data, (long long)r->eval.nseq, (long long)a->seq_len,
           (long long)a->global_batch);
      return -1;
    }
    if (!a->eval_batches) a->eval_batches = whole;
    if (a->eval_batches > whole) {
      TERR("train: --eval-batches %lld: --eval-data %s holds %lld batches of --global-batch %lld",
           (long long)a->eval_batches, a->eval_data, (long long)whole, (long long)a->global_batch);
      return -1;
    }
  }
  if (a->save && tc_check_save_dir(a->save, err, sizeof err)) {
    TERR("train: --save %s", err);
    return -1;
  }
  if (a->record && check_out_file("--record", a->record)) return -1;
  if (a->dump_grads && check_out_file("--dump-grads", a->dump_grads)) return -1;
  if (a->dump && !a->trace) {
    TERR("train: --dump KEY needs --trace FILE (the dump is FILE.dump.safetensors)");
    return -1;
  }
  if (a->trace && check_out_file("--trace", a->trace)) return -1;
  if (tf_parse(getenv("BITEXACT_FAULT"), &r->fault, err, sizeof err)) {
    TERR("train: %s", err);
    return -1;
  }
  return 0;
}

/* Start-up after the settings are agreed: the model, the checkpoint to resume or start
 * from, the buffers, the record and trace files (no collective: a failure waits for the
 * next agreement). 0 / -1 (the message given to TERR). */
static int startup_build(tr_run *r) {
  tr_args *a = &r->a;
  char err[512];
  if (a->device >= 0 && tr_model_use_device(a->device, err, sizeof err)) {
    TERR("train: --device cuda:%d: %s", a->device, err);
    return -1;
  }
  if (tr_model_create(&r->cfg, a->seed, &r->model, err, sizeof err)) {
    TERR("train: building the model: %s", err);
    return -1;
  }
  r->nparams = tr_model_params(r->model, &r->params);
  tr_model_set_ep(r->model, &r->ep);
  if (a->resume) {
    tc_state st;
    if (tc_load(a->resume, r->params, r->nparams, &st, err, sizeof err)) {
      TERR("train: --resume: %s", err);
      return -1;
    }
    int bh = check_resume(a, &st, &r->data);
    if (!bh && st.history && tr_model_set_history(r->model, st.history, st.nhistory, err, sizeof err)) {
      TERR("train: --resume %s: %s", a->resume, err);
      bh = 1;
    }
    free(st.history);
    if (bh) return -1;
    r->start = st.step;
  }
  if (a->init_from && tcm_init_from(a->init_from, r->params, r->nparams, err, sizeof err)) {
    TERR("train: --init-from: %s", err);
    return -1;
  }
  if (a->dump_grads && a->steps <= r->start) {
    TERR("train: --dump-grads needs a step to run (--steps %lld, first step %lld)",
         (long long)a->steps, (long long)r->start);
    return -1;
  }
  if (a->dry_run) return 0; /* writes nothing: dry_run() after the agreement */
  /* buffers, owned tensors */
  int64_t B = a->global_batch, L = a->seq_len, local = B / r->P;
  r->tokens = malloc((size_t)(local * (L + 1)) * sizeof *r->tokens);
  r->tok_loss = malloc((size_t)(local * L) * sizeof *r->tok_loss);
  r->all_loss = malloc((size_t)(B * L) * sizeof *r->all_loss);
  r->words = r->P > 1 ? malloc((size_t)(B * L + r->P) * sizeof *r->words) : NULL; /* + status words */
  r->grads = calloc(r->nparams + 1, sizeof *r->grads);
  if (a->eval_data) {
    r->eval_tokens = malloc((size_t)(local * (L + 1)) * sizeof *r->eval_tokens);
    r->eval_parts = malloc((size_t)(a->eval_batches * local) * sizeof *r->eval_parts);
    if (!r->eval_tokens || !r->eval_parts) {
      TERR("train: out of memory (--eval-data)");
      return -1;
    }
  }
  r->owned[0] = calloc(r->nparams + 1, sizeof(DLTensor));
  r->owned[1] = calloc(r->nparams + 1, sizeof(DLTensor));
  if (!r->tokens || !r->tok_loss || !r->all_loss || (r->P > 1 && !r->words) || !r->grads ||
      !r->owned[0] || !r->owned[1]) {
    TERR("train: out of memory");
    return -1;
  }
  for (size_t i = 0; i < r->nparams; i++) {
    tr_param *q = &r->params[i];
    if (q->group != TR_GROUP_DENSE && q->group != TR_GROUP_EXPERT) continue;
    /* each element counted once: a dense tensor by rank i mod P, an
     * expert's by replica (i mod P/E) of the ranks that hold it */
    int64_t E = r->ep.size, who = q->group == TR_GROUP_DENSE ? (int64_t)(i % (size_t)r->P)
                                                             : (int64_t)(i % (size_t)(r->P / E)) * E + r->ep.rank;
    if (holds(r, q) && who == r->rank) r->owned[q->group][r->nowned[q->group]++] = view(q->grad, q, tr_model_device(r->model));
  }
  int bad = 0;
  if (a->record && r->rank == 0) {
    r->record = fopen(a->record, "w");
    if (!r->record) {
      TERR("train: --record %s: cannot create: %s", a->record, strerror(errno));
      bad = 1;
    }
  }
  if (!bad && a->trace) {
    const char **names = calloc(r->nparams + 1, sizeof *names);
    int *nd = calloc(r->nparams + 1, sizeof *nd);
    const int64_t **sh = calloc(r->nparams + 1, sizeof *sh);
    size_t m = 0;
    char id[64];
    for (size_t i = 0; names && nd && sh && i < r->nparams; i++)
      if (r->params[i].group >= 0) {
        names[m] = r->params[i].name;
        nd[m] = r->params[i].ndim;
        sh[m++] = r->params[i].shape;
      }
    if (names && nd && sh) {
      tt_model_id(names, nd, sh, m, &r->cfg, id, sizeof id);
      r->trace = tt_open(a->trace, id, a->dump, L, r->rank, err, sizeof err);
    } else snprintf(err, sizeof err, "out of memory");
    if (!r->trace) {
      TERR("train: --trace %s", err);
      bad = 1;
    }
    free(names), free(nd), free(sh);
  }
  return bad ? -1 : 0;
}

static const char *const NAMES_KIND[] = {"npy", "bin", "synthetic"};
static const char *const NAMES_DTYPE[] = {"fp32", "bf16"};
static const char *const NAMES_MODE[] = {"invariant", "ordinary"};
static const char *const NAMES_ONOFF[] = {"on", "off"};
static const char *const NAMES_OFFON[] = {"off", "on"};
static const char *const NAMES_GIVEN[] = {"not given", "given"};

static int64_t f64_bits(double d) {
  int64_t v;
  memcpy(&v, &d, 8);
  return v;
}

/* The config's fingerprint: XXH3-64 of its fields (same_config's) in a fixed text. */
static int64_t config_hash(const tr_config *x) {
  char b[2048];
  int n = snprintf(b, sizeof b, "%lld %lld %lld %lld %lld %lld %lld %lld %lld %d %d %a %a %a %lld %lld "
                   "%lld %lld %lld %lld %d %a %a %d %s",
                   (long long)x->vocab_size, (long long)x->hidden_size, (long long)x->intermediate_size,
                   (long long)x->moe_intermediate_size, (long long)x->num_hidden_layers,
                   (long long)x->num_attention_heads, (long long)x->num_key_value_heads,
                   (long long)x->head_dim, (long long)x->max_position_embeddings,
                   (int)x->attention_bias, (int)x->use_qk_norm, x->partial_rotary_factor, x->rope_theta,
                   x->rms_norm_eps, (long long)x->first_k_dense_replace, (long long)x->n_routed_experts,
                   (long long)x->num_experts_per_tok, (long long)x->n_shared_experts,
                   (long long)x->n_group, (long long)x->topk_group, (int)x->norm_topk_prob,
                   x->routed_scaling_factor, x->initializer_range, (int)x->tie_word_embeddings,
                   x->hidden_act);
  return (int64_t)ta_file_hash(b, (size_t)(n > 0 && n < (int)sizeof b ? n : 0));
}

static int64_t data_kind(const td_data *d) { return d->kind == TD_NPY ? 0 : d->kind == TD_BIN ? 1 : 2; }

/* Every run-wide setting as this rank sees it (docs/faults.md lists them); *n of them. */
static size_t run_settings(const tr_run *r, ta_setting *s) {
  const tr_args *a = &r->a;
  size_t n = 0;
#define SET(nm, k, v, names) (s[n++] = (ta_setting){nm, k, (int64_t)(v), names})
  SET("config", TA_HASH, config_hash(&r->cfg), NULL);
  SET("--data (kind)", TA_ENUM, data_kind(&r->data), NAMES_KIND);
  SET("--data (tokens)", TA_INT, r->data.ntokens, NULL);
  SET("--data (the file's size, first and last MiB)", TA_HASH,
      r->data.map ? ta_file_hash(r->data.map, r->data.map_len) : 0, NULL);
  SET("--seed", TA_UINT, a->seed, NULL);
  SET("--seq-len", TA_INT, a->seq_len, NULL);
  SET("--global-batch", TA_INT, a->global_batch, NULL);
  SET("--micro-batches", TA_INT, a->micro_batches, NULL);
  SET("--ep", TA_INT, a->ep, NULL);
  SET("--steps", TA_INT, a->steps, NULL);
  SET("--compute-dtype", TA_ENUM, a->bf16, NAMES_DTYPE);
  SET("--mode", TA_ENUM, a->ordinary, NAMES_MODE);
  SET("--grid-history", TA_ENUM, a->no_history, NAMES_ONOFF);
  SET("--shuffle", TA_ENUM, a->shuffle, NAMES_OFFON);
  SET("--lr", TA_F64, f64_bits(a->lr), NULL);
  SET("--lr-scheduler", TA_ENUM, a->sched, sched_names);
  SET("--warmup-steps", TA_INT, a->warmup_steps, NULL);
  SET("--min-lr", TA_F64, f64_bits(a->min_lr), NULL);
  SET("--adam-beta1", TA_F64, f64_bits(a->beta1), NULL);
  SET("--adam-beta2", TA_F64, f64_bits(a->beta2), NULL);
  SET("--adam-epsilon", TA_F64, f64_bits(a->eps), NULL);
  SET("--weight-decay", TA_F64, f64_bits(a->weight_decay), NULL);
  SET("--clip", TA_F64, f64_bits(a->clip), NULL);
  SET("--resume", TA_ENUM, a->resume != NULL, NAMES_GIVEN);
  SET("--init-from", TA_ENUM, a->init_from != NULL, NAMES_GIVEN);
  SET("--save", TA_ENUM, a->save != NULL, NAMES_GIVEN);
  SET("--save-every", TA_INT, a->save_every, NULL);
  SET("--save-max-shard-size", TA_INT, a->save_max_shard, NULL);
  SET("--eval-data", TA_ENUM, a->eval_data != NULL, NAMES_GIVEN);
  SET("--eval-data (tokens)", TA_INT, a->eval_data ? r->eval.ntokens : 0, NULL);
  SET("--eval-every", TA_INT, a->eval_every, NULL);
  SET("--eval-batches", TA_INT, a->eval_batches, NULL);
  SET("--dump-grads", TA_ENUM, a->dump_grads != NULL, NAMES_GIVEN);
  SET("--trace", TA_ENUM, a->trace != NULL, NAMES_GIVEN);
  SET("--dry-run", TA_ENUM, a->dry_run, NAMES_OFFON);
  SET("the library version", TA_INT, bx_version(), NULL);
  SET("the accumulator format", TA_INT, BX_ACC_FORMAT, NULL);
  SET("the record format", TA_INT, TREC_FORMAT, NULL);
  SET("the checkpoint format", TA_INT, TC_FORMAT_VERSION, NULL);
#undef SET
  return n;
}
#define TA_MAX_SETTINGS 48

/* The start-up agreement (every rank, failed or not): a failure on any rank is printed by
 * the lowest failed rank (plainly when every rank failed alike, else naming it), a
 * setting that differs by rank 0; 0 when the ranks go on. */
static int startup_agree(tr_run *r, int failed, int with_settings) {
  ta_setting s[TA_MAX_SETTINGS];
  size_t n = with_settings ? run_settings(r, s) : 0;
  r->lvl = failed ? 2 : 0;
  int64_t v = 0;
  int all = 0;
  char err[900];
  err[0] = 0;
  int rc = ta_agree(r->comm, r->rank, r->P, status_word(r), s, n, &v, &all, err, sizeof err);
  int reported = 0;
  if (v) {
    const int64_t top = (int64_t)1 << 40;
    int who = (int)(top - 1 - (v & (top - 1)));
    const char *m = g_defer_msg[0] ? g_defer_msg : "train: failed (no message)";
    if (who == r->rank && g_defer) { /* one process: printed already */
      if (all) cli_error("%s", m);
      else cli_error("train: rank %d: %s", who, strncmp(m, "train: ", 7) == 0 ? m + 7 : m);
    }
    reported = 1;
  } else if (rc) {
    if (r->rank == 0) cli_error("train: %s", err);
    reported = 1;
  }
  r->lvl = 0;
  g_defer_msg[0] = 0;
  return reported ? -1 : 0;
}

static int train_main(tr_run *r, int argc, char **argv) {
  tr_args *a = &r->a;
  int bad = startup_local(r, argc, argv) != 0;
  if (startup_agree(r, bad, 1)) return CLI_ERROR; /* the same words on every rank */
  if (a->dry_run && !a->resume && !a->init_from) {
    g_defer = 0;
    dry_run(r);
    return CLI_OK;
  }
  /* the EP communicators first: MPI_Comm_split is collective, every rank calls it */
  bad = trm_ep_init((int)a->ep, &r->ep) != 0;
  if (bad) TERR("train: --ep %lld: cannot build the expert-parallel communicators", (long long)a->ep);
  if (!bad) bad = startup_build(r) != 0;
  if (startup_agree(r, bad, 0)) return CLI_ERROR;
  g_defer = 0;
  if (a->dry_run) {
    dry_run(r);
    return CLI_OK;
  }
  int64_t L = a->seq_len;
  (void)L;
  r->first_loss = r->last_loss = r->last_eval = NAN;
  r->last_norm = NAN;
  r->end = a->steps;
  r->saved_step = -1;
  catch_stop_signals();
  double t_run = cli_now();
  for (int64_t s = r->start; s < a->steps; s++) {
    double t0 = cli_now();
    long rec_pos = -1;
    if (run_step(r, s, &rec_pos)) return CLI_ERROR; /* agreed inside the step */
    /* one agreement: a failure anywhere, a stop signal anywhere */
    int64_t flags[2] = {status_word(r), g_stop != 0};
    if (r->comm && r->comm->allreduce_i64(flags, 2, BX_OP_MAX, r->comm->ctx) != 0) {
      cli_error("train: rank %d: step %lld: the ranks' agreement (an all-reduce) failed", r->rank,
                (long long)s);
      flags[0] = 1;
    }
    if (flags[0]) {
      decide(r, flags[0]);
      /* the step failed on some rank: its record line (rank 0 wrote it) goes */
      if (r->record && rec_pos >= 0 && r->line_written) {
        r->lines--;
        if (fflush(r->record) != 0 || ftruncate(fileno(r->record), rec_pos) != 0 ||
            fseek(r->record, rec_pos, SEEK_SET) != 0)
          cli_error("train: --record %s: cannot remove the line of the failed step %lld", a->record,
                    (long long)s);
      }
      return CLI_ERROR;
    }
    if (s == r->start) r->t_first = cli_now() - t0;
    else r->t_rest += cli_now() - t0;
    progress_line(r, s, cli_now() - t_run);
    if (flags[1]) {
      r->end = s + 1;
      r->stopped = 1;
      break;
    }
    if (a->save_every && (s + 1) % a->save_every == 0 && s + 1 < a->steps &&
        save_checkpoint(r, s + 1) != 0)
      return CLI_ERROR;
  }
  if (r->trace) {
    int e = tt_close(r->trace);
    r->trace = NULL;
    if (e != 0) {
      cli_error("train: --trace %s: cannot write", a->trace);
      return CLI_ERROR;
    }
  }
  if (r->record) {
    int e = fclose(r->record);
    r->record = NULL;
    if (e != 0) {
      cli_error("train: --record %s: cannot write", a->record);
      return CLI_ERROR;
    }
  }
  bad = a->save && save_checkpoint(r, r->end) != 0;
  if (any_rank(r->comm, bad)) return CLI_ERROR;
  if (r->rank == 0) summary(r);
  return CLI_OK;
}

int cmd_train(int argc, char **argv) {
  tr_run r;
  memset(&r, 0, sizeof r);
  trm_init(&r.rank, &r.P, &r.comm);
  g_rank = r.rank;
  g_defer = r.P > 1;
  int rc = train_main(&r, argc, argv);
  if (r.record) { /* a failed run: keep the steps it recorded, if any */
    fclose(r.record);
    if (r.lines == 0) unlink(r.a.record);
  }
  tt_close(r.trace); /* a failed run: the steps traced so far stay */
  if (r.model) tr_model_destroy(r.model);
  tr_model_use_device(-1, NULL, 0);
  td_close(&r.data);
  td_close(&r.eval);
  free(r.eval_tokens);
  free(r.eval_parts);
  free(r.tokens);
  free(r.tok_loss);
  free(r.all_loss);
  free(r.words);
  free(r.grads);
  free(r.owned[0]);
  free(r.owned[1]);
  return trm_finish(rc);
}
