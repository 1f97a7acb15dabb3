"""docs/architecture.md rule 10 as a check: the Python package holds no
second copy of the model's numerics. Read from the source tree
(python/bitexact), not the installed package:

- a kernel of bitexact.kernels is called only where it is a whole
  autograd node by itself (one C entry: RMSNorm's forward, SwiGLU, RoPE,
  attention, the embedding's forward, the cross-entropy's count and scaled
  backward, the dispatch plan, AdamW);
- no function sequences two or more kernel calls, token-reduction partials
  (bound / add), bf16 roundings or expert exchanges: that is a node's job
  (src/glm, bitexact._core.glm_*);
- the GradReduction's step is the model module's protocol object
  (bitexact._core.GradRed); nn/_gradred.py only keeps its phases.
"""
import ast
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "bitexact")

# not the model path: the public kernel bindings, the clip API and its drop-ins
OUTSIDE = {"kernels.py", "__init__.py", "_frameworks.py", "deepspeed.py", "megatron.py",
           "torchtitan.py", "scripts/__init__.py", "scripts/train.py", "torch/__init__.py",
           "torch/_plan.py", "torch/_ops.py", "torch/_cuda.py", "torch/_fsdp.py",
           "torch/_groups.py", "paddle/__init__.py"}
SINGLE_NODES = {"rmsnorm_forward", "swiglu_forward", "swiglu_backward", "rope_forward",
                "rope_backward", "attention_forward", "attention_backward", "embedding_forward",
                "xent_count", "xent_backward", "moe_dispatch_plan", "adamw_step",
                # the trainer's evaluation: each sequence's loss sum (one C call; the mean
                # over the ranks is the node glm_eval_mean), and the schedule's rate (a scalar)
                "xent_forward", "lr_at"}
SEQUENCE = re.compile(r"\b_k\.\w+\(|\bgemm\(|\b(s|sl|state)\.(bound|add|bound_exp)\(|"
                      r"linear_wgrad|embedding_grad_|moe_expert_chunks|wgrad_bound_exp|"
                      r"\.to\(torch\.bfloat16\)|astype\(\"bfloat16\"\)|_exchange\(")
# functions allowed to hold two such lines (none: the protocol is glm_gr)
ALLOWED = set()


def model_path_files():
    for d, _, files in os.walk(ROOT):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
            if f.endswith(".py") and rel not in OUTSIDE:
                yield rel, os.path.join(d, f)


def test_the_model_path_is_read():
    files = dict(model_path_files())
    for must in ("nn/_layers.py", "nn/_moe.py", "nn/_gradred.py", "nn/_ep.py",
                 "torch/_layers.py", "paddle/_layers.py", "train/_run.py"):
        assert must in files, f"{must} not found under {ROOT}"


def test_kernels_only_as_whole_nodes():
    bad = []
    for rel, path in model_path_files():
        for i, line in enumerate(open(path).read().split("\n"), 1):
            code = line.split("#")[0]
            for m in re.finditer(r"\b_k\.(\w+)\(", code):
                if m.group(1) not in SINGLE_NODES:
                    bad.append(f"{rel}:{i}: _k.{m.group(1)}")
    assert not bad, ("kernels sequenced in Python (write a node in src/glm): " + ", ".join(bad))


def test_no_function_sequences_numerics():
    bad = []
    for rel, path in model_path_files():
        src = open(path).read()
        lines = src.split("\n")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef):
                hits = [ln for ln in lines[node.lineno - 1:node.end_lineno]
                        if SEQUENCE.search(ln.split("#")[0])]
                if len(hits) >= 2 and (rel, node.name) not in ALLOWED:
                    bad.append(f"{rel}:{node.name} ({len(hits)})")
    assert not bad, "functions ordering numerics in Python: " + ", ".join(bad)
