/*
 * main.c — the `bitexact` command: dispatch to norm, hash, diff, demo and train,
 * and the help text (the reference for every output and exit status).
 */
#include <stdio.h>
#include <string.h>

#include <bitexact.h>

#include "cli.h"

int cli_out_finish(int keep);

static const char help[] =
    "bitexact — exact norms, canonical hashes and bitwise diffs of checkpoint files\n"
    "\n"
    "usage:\n"
    "  bitexact norm [--ord P] [--group NAME=GLOB]... [options] FILE...\n"
    "  bitexact hash [options] FILE...\n"
    "  bitexact diff [options] A B\n"
    "  bitexact demo [--json]\n"
    "  bitexact train [--config FILE.json] [--data FILE] [--steps N] [options]\n"
    "  bitexact plot [--drift REF.jsonl] [--label NAME]... -o FILE.svg RECORD.jsonl...\n"
    "  bitexact --version | --help\n"
    "\n"
    "Options for every command: --json (machine-readable output), --threads N\n"
    "(default: BX_NUM_THREADS or the online CPUs; results never depend on it),\n"
    "-q (totals only), --progress / --no-progress (default: a bar on stderr\n"
    "when it is a terminal and the input is 256 MiB or more).\n"
    "\n"
    "norm FILE...\n"
    "  The norm of every F16/BF16/F32/F64 tensor of the safetensors FILEs: per\n"
    "  tensor, per --group and in total, computed exactly (bitexact.h: exact\n"
    "  squares, exact integer sum, one correct rounding) from the memory-mapped\n"
    "  files, never read whole. Tensors of other dtypes (integers, BOOL, fp8,\n"
    "  fp4/fp6, C64) are skipped with a note on stderr and listed under\n"
    "  \"skipped\" in --json. A name present in several FILEs is read as shards\n"
    "  of one tensor (tensor-parallel dumps): its norm covers all its elements.\n"
    "  --ord P    2 (default), 1, inf, -inf (min |x|), 0 (count of non-zeros):\n"
    "             exact; any other P > 0: |x|^P rounded per element, then an\n"
    "             exact sum (deterministic, not exact; no progress bar).\n"
    "  --group NAME=GLOB   also the norm of the tensors whose name matches the\n"
    "             fnmatch(3) GLOB ('*' also matches '.'); repeatable; a tensor\n"
    "             may be in several groups or none.\n"
    "  --error-if-nonfinite   exit 2 naming the first tensor holding NaN/Inf.\n"
    "  NaN anywhere gives NaN; otherwise Inf gives inf. Text: one line per tensor\n"
    "  (norm as %.17g, its hex float, dtype, shape, name), groups, total_norm.\n"
    "  --json: {\"total_norm\": number (%.17g, so the double round-trips),\n"
    "  \"total_norm_hex\", \"tensors\": {name: norm}, \"tensors_hex\", \"groups\",\n"
    "  \"groups_hex\", \"skipped\": {name: dtype}, \"elements\", \"files\", \"ord\"};\n"
    "  a NaN/Inf norm is null in the number fields, \"nan\"/\"inf\" in the hex.\n"
    "\n"
    "hash FILE...\n"
    "  Canonical hashes with XXH3-128 (Debian's libxxhash), independent of the\n"
    "  tensors' order and padding in the file and of how a checkpoint is split\n"
    "  into FILEs (a name may appear only once over all FILEs). With u64(x) the\n"
    "  8-byte little-endian encoding of x:\n"
    "    tensor hash = XXH3-128, seed 0, of  u64(len(name)) name\n"
    "                  u64(len(dtype)) dtype u64(ndim) u64(dim_0) ... u64(dim_n-1)\n"
    "                  u64(nbytes) data\n"
    "    (name and dtype as UTF-8 bytes as in the header, e.g. \"BF16\"; data: the\n"
    "    tensor's bytes exactly as stored, little-endian)\n"
    "    checkpoint hash = XXH3-128, seed 0, of the 16-byte canonical (big-endian)\n"
    "                  tensor hashes, in bytewise order of the tensor names.\n"
    "  Printed as 32 hex digits, as xxh128sum does. __metadata__ is not hashed.\n"
    "  Every dtype is hashed (bytes). --json: {\"checkpoint\", \"tensors\": {name:\n"
    "  {\"hash\", \"dtype\", \"shape\"}}, \"files\"}.\n"
    "\n"
    "diff A B\n"
    "  Two safetensors files: tensors only in A or only in B, dtype or shape\n"
    "  mismatches, and for each common tensor: bitwise equal, or the number of\n"
    "  elements whose bits differ, the largest ULP distance, the largest\n"
    "  absolute and relative difference and the first differing index.\n"
    "  Exit 0: identical tensors (names, dtypes, shapes, bytes; __metadata__ is\n"
    "  not compared), 1: they differ, 2: error. How elements count:\n"
    "    differing         bit patterns differ (so +0 vs -0 and two NaNs with\n"
    "                      different payloads are differing elements);\n"
    "    ULP distance      |ord(a) - ord(b)|, where ord maps a float's bits to an\n"
    "                      integer monotone in its value with +0 and -0 both 0:\n"
    "                      the number of representable values between a and b\n"
    "                      (+-0: 0 ULP; inf is 1 ULP above the largest finite);\n"
    "                      for integer dtypes |a - b|;\n"
    "    NaN               NaN vs NaN with other bits: counted in nan_payload, 0\n"
    "                      ULP; NaN vs a number: counted in nan_mismatch, left\n"
    "                      out of the ULP, abs and rel maxima;\n"
    "    abs, rel          |a - b| and |a - b| / max(|a|, |b|), in fp64 (0 when\n"
    "                      a == b as numbers).\n"
    "  Sub-byte dtypes (F4, F6_*) are compared byte by byte; C64 as pairs of\n"
    "  F32 (counts are of components, the first index of the complex element).\n"
    "  Two run records (JSON Lines, one object per step with \"step\" and values\n"
    "  such as \"loss\" and \"grad_norm\", written as hex-float strings like\n"
    "  \"0x1.8p+1\" so no bit is lost; plain JSON numbers are read too): the\n"
    "  steps only in one file, and the first step whose values differ, with the\n"
    "  ULP distance of each differing value. Files starting with '{' are read\n"
    "  as run records (--records / --safetensors force a kind).\n"
    "  Two traces (bitexact.torch.trace, bitexact.paddle.trace, docs/trace.md;\n"
    "  --trace, or a first line with \"bitexact_trace\"): the first entry in A's\n"
    "  execution order that B also has and whose bits differ (step, phase,\n"
    "  module, sequence, element, both values, ULP; beyond the kept values, its\n"
    "  part and the --dump key of the whole value), then the differing entries\n"
    "  per module and the entries only in A or only in B (the first of each\n"
    "  named; they also make the exit status 1); traces of other models refused.\n"
    "\n"
    "demo\n"
    "  Built-in synthetic gradients of a small mixture-of-experts transformer\n"
    "  (embeddings, attention, dense MLP, 8 experts per layer, fp32 and bf16):\n"
    "  the global norm under 1, 2, 4 and 8 ranks, 1 and 2 threads, model and\n"
    "  shuffled tensor order. Ranks are MPI ranks when this binary was built\n"
    "  with MPI and is run under mpirun with that many ranks or more; otherwise\n"
    "  threads in this process, each with a bx_comm whose all-reduce sums int64\n"
    "  words across them. Prints naive fp32 norms (their bits differ between\n"
    "  layouts) against bitexact's (identical bits) and the clip coefficient\n"
    "  (bx_clip_coef, max_norm 1.0). Exit 1 if bitexact's bits ever differ.\n"
    "\n"
    "train\n"
    "  Trains the GLM-4.5 MoE decoder (transformers' Glm4MoeForCausalLM; a tiny\n"
    "  built-in config unless --config FILE.json) with AdamW, its losses,\n"
    "  gradients and checkpoints bitwise identical for any thread count,\n"
    "  micro-batch count and number of MPI ranks (under mpirun -np P).\n"
    "  --data FILE   token ids: a 1-D .npy integer array or a raw uint16 *.bin\n"
    "                (nanoGPT); default: a synthetic Markov corpus whose entropy\n"
    "                rate (the lowest loss) is printed\n"
    "  --steps N (10) --seed S (0) --seq-len L (64) --global-batch B (8, sequences\n"
    "  per step) --micro-batches M (1) --ep E (1: expert-parallel ranks, divides P)\n"
    "  --lr X (1e-3) --weight-decay X (0.01) --clip X (1.0; 0: none)\n"
    "  --lr-scheduler constant|linear|cosine|constant_with_warmup (constant;\n"
    "                transformers' formulas over --steps, rounded once: bx_lr_at)\n"
    "  --warmup-steps W (0) --min-lr X (0; linear and cosine end there)\n"
    "  --adam-beta1 X (0.9) --adam-beta2 X (0.999) --adam-epsilon X (1e-8)\n"
    "  --compute-dtype fp32|bf16 (fp32)   --grid-history on|off (on: one pass)\n"
    "  --mode invariant|ordinary (ordinary: float token reductions in layout\n"
    "                order, the negative control whose bits drift)\n"
    "  --shuffle     permute the sequences per epoch (counter-based, of the seed)\n"
    "  --record FILE.jsonl   one line per step: loss, grad norms, clip_coef, lr,\n"
    "                tokens, a hash of the per-token losses (hex floats: compare\n"
    "                two runs with bitexact diff A.jsonl B.jsonl)\n"
    "  --save DIR    config.json + model.safetensors (transformers loads it) +\n"
    "                optimizer/optimizer.safetensors + trainer_state.json, atomically\n"
    "  --save-max-shard-size SIZE   the model as shards + index (e.g. 2GB)\n"
    "  --save-every K   also save after every K-th step (DIR: the last complete one)\n"
    "  --eval-data FILE --eval-every K [--eval-batches N]   the exact mean loss of\n"
    "                N batches of FILE after every K-th step: eval_loss in the record\n"
    "  --resume DIR  continue bit for bit; --steps N is the step the run ends at\n"
    "  --init-from DIR   start at step 0 from a transformers-style checkpoint\n"
    "                (model.safetensors or shards + index; F32, BF16 or F16)\n"
    "  SIGTERM/SIGINT: the step finishes on every rank, --save is written, exit 0\n"
    "  A progress line (step, loss, lr, tokens/s, ETA) on a terminal; -q: none.\n"
    "  --dump-grads FILE   the last step's gradients (before clipping) as safetensors\n"
    "  --trace FILE  per step, the XXH3-64 of every module output and input gradient\n"
    "                per sequence, every gradient and updated parameter: the same\n"
    "                bytes on every layout (bitexact diff --trace A B: the first\n"
    "                divergence; docs/trace.md)\n"
    "  --dump KEY    with --trace: that entry's values (KEY step/phase/module/what/\n"
    "                sequence or -) to FILE.dump.safetensors\n"
    "  --dry-run     check everything, print the plan and the data order as JSON\n"
    "  docs/train_cli.md has the data order, the record and the checkpoint format.\n"
    "\n"
    "plot RECORD.jsonl...\n"
    "  Curves of run records (bitexact train --record) as a plain SVG file on\n"
    "  shared step axes: a loss panel (eval_loss dashed with markers), the\n"
    "  learning rate and the gradient norm (each when present), one colour per\n"
    "  run (--label names them; default: the file names; at most 16 runs).\n"
    "  --drift REF.jsonl   instead: per step, the fp32 ULP distance of each\n"
    "                record's loss from REF's, on a log scale of 1 + ULPs\n"
    "                (a layout-invariant run is the flat line at 0).\n"
    "  --title TEXT  the first panel's title. -o FILE.svg is written atomically.\n"
    "\n"
    "Errors: one line on stderr naming the file (and tensor), exit status 2, and\n"
    "nothing on stdout: results are printed only once complete.\n";

/* `bitexact CMD --help`: the usage line and CMD's section of the help. */
static int sub_help(const char *cmd) {
  char key[32];
  snprintf(key, sizeof key, "\n\n%s", cmd);
  const char *p = help, *sec = NULL;
  while ((p = strstr(p, key)) != NULL) {
    char c = p[strlen(key)];
    if (c == ' ' || c == '\n') {
      sec = p + 2;
      break;
    }
    p++;
  }
  snprintf(key, sizeof key, "  bitexact %s", cmd);
  const char *use = strstr(help, key);
  if (!sec || !use) return CLI_ERROR;
  const char *use_end = strchr(use, '\n'), *sec_end = strstr(sec, "\n\n");
  const char *common = strstr(help, "Options for every command");
  const char *common_end = common ? strstr(common, "\n\n") : NULL;
  printf("usage:\n%.*s\n\n%.*s\n\n", (int)(use_end - use), use,
         (int)(sec_end ? sec_end - sec : (long)strlen(sec)), sec);
  if (common && common_end) printf("%.*s\n", (int)(common_end - common), common);
  return fflush(stdout) == 0 ? CLI_OK : CLI_ERROR;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(help, stderr);
    return CLI_ERROR;
  }
  const char *cmd = argv[1];
  int rc;
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(help, stdout);
    return fflush(stdout) == 0 ? CLI_OK : CLI_ERROR;
  }
  if (strcmp(cmd, "--version") == 0) {
    unsigned v = bx_version();
    printf("bitexact %u.%u.%u\n", v / 10000, v / 100 % 100, v % 100);
    return fflush(stdout) == 0 ? CLI_OK : CLI_ERROR;
  }
  static const char *const cmds[] = {"norm", "hash", "diff", "demo", "train", "plot"};
  for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++)
    if (strcmp(cmd, cmds[k]) == 0)
      for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return sub_help(cmd);
  if (strcmp(cmd, "norm") == 0) rc = cmd_norm(argc - 1, argv + 1);
  else if (strcmp(cmd, "hash") == 0) rc = cmd_hash(argc - 1, argv + 1);
  else if (strcmp(cmd, "diff") == 0) rc = cmd_diff(argc - 1, argv + 1);
  else if (strcmp(cmd, "demo") == 0) rc = cmd_demo(argc - 1, argv + 1);
  else if (strcmp(cmd, "train") == 0) rc = cmd_train(argc - 1, argv + 1);
  else if (strcmp(cmd, "plot") == 0) rc = cmd_plot(argc - 1, argv + 1);
  else {
    cli_error("unknown command '%s' (norm, hash, diff, demo, train, plot; --help)", cmd);
    return CLI_ERROR;
  }
  if (cli_out_finish(rc != CLI_ERROR) != 0) {
    cli_error("cannot write the results to standard output");
    return CLI_ERROR;
  }
  return rc;
}
