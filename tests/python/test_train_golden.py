"""The torch and Paddle trainers (``python -m bitexact.train``) against the
golden bits of `bitexact train` in tests/golden/train.json (written by
tests/cli/cases_golden.py from the C trainer, never by hand): issue 25's
"bits do not move" for the bindings. Each run starts from the C trainer's
step-0 checkpoint of the tiny config and trains the golden's steps; every
record line and the canonical hashes of the model and optimizer state must
equal the golden case's, fp32 and bf16 compute, 1 process with micro-batches
and 2 processes with expert parallelism."""
import json
import os

import pytest

from test_train_bindings import CLI, ROOT, _hash, _py_train, _run

GOLDEN = os.path.join(ROOT, "tests", "golden", "train.json")
TINY = ("--seq-len", "16", "--global-batch", "8")

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK),
                                reason=f"the bitexact command is not built ({CLI})")


@pytest.fixture(scope="module")
def golden():
    with open(GOLDEN) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def step0(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden_ck0")
    out = {}
    for dtype in ("fp32", "bf16"):
        ck0 = str(d / dtype)
        p = _run([CLI, "train", "--steps", "0", "--save", ck0, "--compute-dtype", dtype, "-q",
                  *TINY])
        assert p.returncode == 0, p.stderr
        out[dtype] = ck0
    return out


@pytest.mark.parametrize("fw,dtype,ranks,extra", [
    pytest.param("torch", "fp32", 1, ("--micro-batches", "2"), id="torch-fp32-mb2"),
    pytest.param("torch", "fp32", 2, ("--ep", "2"), id="torch-fp32-ep2"),
    pytest.param("torch", "bf16", 1, (), id="torch-bf16"),
    pytest.param("paddle", "fp32", 1, (), id="paddle-fp32"),
    pytest.param("paddle", "bf16", 2, ("--ep", "2", "--micro-batches", "2"),
                 id="paddle-bf16-ep2-mb2"),
])
def test_binding_equals_golden(golden, step0, tmp_path, fw, dtype, ranks, extra):
    if fw == "paddle":
        pytest.importorskip("paddle")
    want = golden["cases"]["tiny-" + dtype]
    rec, ck = _py_train(fw, ranks, str(tmp_path), step0[dtype], *TINY, "--compute-dtype", dtype,
                        *extra, steps=golden["steps"])
    with open(rec) as f:
        got = [json.loads(line) for line in f if line.strip()]
    assert len(got) == len(want["records"])
    for k, (a, b) in enumerate(zip(got, want["records"])):
        assert a == b, f"record line {k} moved:\n got  {a}\n want {b}"
    for name, f in (("model", "model.safetensors"), ("optimizer", "optimizer/optimizer.safetensors")):
        assert _hash(os.path.join(ck, f)) == want[name], name
