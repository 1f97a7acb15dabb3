"""The one-pass invariant step (docs/train_model.md, "The one-pass
invariant step") on the bindings: GradReduction.run_step states the grid
from the history, runs every micro-batch once and falls back to a second
pass on the observed grid when an add breaks it (or there is no history).

In process (bitexact.torch's tiny model of test_torch_layers.py): the
history against an independent reference (the MAX of single-sequence
reductions' histories), the passes a step takes, layout-invariant bits of
the one-pass step and of the forced fallback, an overflow that really
triggers the fallback giving the forced fallback's bits, the manual
protocol and its errors, the bounds and history rules against their
documented formulas.

Through ``python -m bitexact.train`` against the C trainer (`bitexact
train`, build/bitexact): resuming a C checkpoint that carries a grid
history continues its run bit for bit in one pass a step (1 process and
--ep 2, where each rank holds only its experts' history and rank 0 gathers
the rest to save), a format_version 1 checkpoint resumes with two passes
first, --grid-history off, and a bad grid_history refused naming the key."""
import json
import os
import shutil
import sys

import pytest
import torch

import bitexact
import bitexact.torch as bt
import torch_layers_model as M
from helpers import same_bits
from test_train_bindings import CLI, _hash, _py_train, _run

STEPS = 3


def _closure(model, tokens, per):
    def closure(i):
        ids, tg, pos = M.batch(tokens[i * per:(i + 1) * per])
        loss = bt.cross_entropy(model(ids, pos), tg)
        loss.backward()
        return loss.detach()
    return closure


def _train(micro_batches, use_history=True, history=None, steps=STEPS):
    """steps steps of the tiny model (SGD on the exact gradients, so every
    step's partials differ) through run_step; returns the per-step
    (passes, history, gradients) and the reduction."""
    model = M.Tiny()
    red = bt.GradReduction(model.named_parameters(), M.L, M.SEQS * M.L, num_threads=1)
    if history is not None:
        red.history = history
    per = M.SEQS // micro_batches
    out = []
    for s in range(STEPS if steps is None else steps):
        mbs = [(i * per * M.L, per * M.L) for i in range(micro_batches)]
        red.run_step(_closure(model, M.data(s), per), mbs, use_history=use_history)
        grads = [p.grad.clone() for p in model.parameters()]
        out.append((red.passes, red.history, grads, red.loss.clone()))
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
    return out, red


def _same_grads(a, b):
    return all(same_bits(x, y) for x, y in zip(a, b))


def test_history_is_the_max_over_sequences():
    """A step's observed exponents are the largest over its chunk partials
    (one chunk = one sequence) and ranks: the first step's history equals
    the MAX of the histories of 8 reductions that each hold one sequence
    (the same loss divisor, so the same partials)."""
    out, _ = _train(2, steps=1)
    full = out[0][1]
    model = M.Tiny()
    tokens = M.data(0)
    single = []
    for j in range(M.SEQS):
        red = bt.GradReduction(model.named_parameters(), M.L, M.L, num_threads=1)
        red.run_step(_closure(model, tokens[j:j + 1], 1), [(0, M.L)], n_targets=M.SEQS * M.L)
        single.append(red.history)
    want = {k: max(h[k] for h in single) for k in full}
    assert full == want
    assert len(set(full.values())) > 2 and all(-149 < v < 128 for v in full.values()), full
    assert list(full) == [n for n, _ in model.named_parameters()] + ["loss"]


@pytest.mark.parametrize("use_history", [True, False], ids=["history", "forced-fallback"])
def test_run_step_bits_are_layout_invariant(use_history):
    """1, 2 and 4 micro-batches give the same gradients, losses and
    histories bit for bit, with the history (passes 2, 1, 1) and without it
    (every step the fallback's 2 passes)."""
    runs = {M_: _train(M_, use_history)[0] for M_ in (1, 2, 4)}
    for M_ in (2, 4):
        for s in range(STEPS):
            a, b = runs[1][s], runs[M_][s]
            assert a[0] == b[0] and a[1] == b[1], (M_, s)
            assert _same_grads(a[2], b[2]) and same_bits(a[3], b[3]), (M_, s)
    assert [r[0] for r in runs[1]] == ([2, 1, 1] if use_history else [2, 2, 2])


def test_overflow_triggers_the_fallback_with_its_bits():
    """A history far below the partials (every exponent -60: bounds -57)
    breaks the stated grid in attempt 1; the step then runs again on its
    observed grid: 2 passes and the bits of the forced fallback (no
    history); the history afterwards is the observed one (max(observed,
    -60 - GRID_DECAY))."""
    model = M.Tiny()
    names = [n for n, _ in model.named_parameters()]
    low = {n: -60 for n in names + ["loss"]}
    forced, _ = _train(2, use_history=False, steps=1)
    broke, red = _train(2, history=low, steps=1)
    assert broke[0][0] == 2 and red.overflowed is False
    assert _same_grads(broke[0][2], forced[0][2]) and same_bits(broke[0][3], forced[0][3])
    assert broke[0][1] == forced[0][1]
    # a history that holds: one pass
    high, red = _train(2, history={n: v + 1 for n, v in forced[0][1].items()}, steps=1)
    assert high[0][0] == 1


def test_manual_protocol_and_its_errors():
    """begin(bounds) -> agree -> micro-batches once -> allreduce (True: the
    grid broke) -> finish refuses naming the tensors; begin(bounds=observed)
    holds and finish writes the fallback's bits. Wrong phases and bad
    bounds are refused with a clear message."""
    model = M.Tiny()
    names = [n for n, _ in model.named_parameters()]
    red = bt.GradReduction(model.named_parameters(), M.L, M.SEQS * M.L, num_threads=1)
    closure = _closure(model, M.data(0), M.SEQS)
    red.begin(bounds=[-60] * (len(names) + 1))
    assert red.phase == "stated"
    with pytest.raises(bitexact.InvalidArgumentError, match="not agreed yet.*agree"):
        with red.micro_batch(0, M.SEQS * M.L):
            pass
    red.agree()
    with red.micro_batch(0, M.SEQS * M.L):
        closure(0)
    assert red.allreduce() is True and red.phase == "overflowed"
    obs = red.observed
    assert set(obs) == set(names) | {"loss"}
    with pytest.raises(bitexact.InvalidArgumentError,
                       match=r"broke the stated grid \(embed\.weight"):
        red.finish()
    with pytest.raises(bitexact.InvalidArgumentError, match="broke the stated grid"):
        red.agree()
    red.begin(bounds=obs, flag_overflow=False)
    red.agree()
    with red.micro_batch(0, M.SEQS * M.L):
        closure(0)
    assert red.allreduce() is False and red.phase == "reduced"
    red.finish()
    got = [p.grad.clone() for p in model.parameters()]
    assert red.history == obs  # no history before: the observed exponents
    forced, _ = _train(1, use_history=False, steps=1)
    assert _same_grads(got, forced[0][2])

    with pytest.raises(bitexact.InvalidArgumentError, match="allreduce: called in phase 'done'"):
        red.allreduce()
    red.begin()
    with pytest.raises(bitexact.InvalidArgumentError, match="allreduce: called in phase 'bound'"):
        red.allreduce()
    n1 = len(names) + 1
    bad = [([0] * (n1 - 1), f"holds {n1 - 1} values, {n1} expected"),
           ([0] * (n1 - 1) + [129], "loss: 129 is outside"),
           ([0] * (n1 - 1) + [1.5], "loss: 1.5 is not an int"),
           (dict(obs, extra=0), "unexpected \\['extra'\\]"),
           ({k: v for k, v in obs.items() if k != "head.weight"}, "missing \\['head.weight'\\]"),
           ("no", "a dict name -> exponent")]
    for b, needle in bad:
        with pytest.raises(bitexact.InvalidArgumentError, match=needle):
            red.begin(bounds=b)
        with pytest.raises(bitexact.InvalidArgumentError, match=needle):
            red.history = b
    with pytest.raises(bitexact.InvalidArgumentError,
                       match="'history': head.weight: -150 is outside"):
        red.history = dict(obs, **{"head.weight": -150})


def test_bounds_and_history_rules():
    """stated_bounds and the history update against their documented
    formulas (glm_node.h): bound = min(h + GRID_MARGIN, 128), a gradient
    never seen (-149) taking the largest gradient history (of the tensors
    held and of top), the loss its own; history = max(observed, prev -
    GRID_DECAY), at least -149."""
    m, d = bt.GradReduction.GRID_MARGIN, bt.GradReduction.GRID_DECAY
    assert m >= 1 and d >= 0
    g = bitexact._core.GradRed([(3,), (2, 2), (5,)], 4, 8)
    assert g.stated_bounds() == [-149] * 4
    h = [-10, -149, 127, -149]

    def rule(h, top=-149):
        t = max(h[:-1] + [top])
        return [min((t if x == -149 and i < len(h) - 1 else x) + m, 128)
                for i, x in enumerate(h)]
    assert g.stated_bounds(h) == rule(h)
    h = [-10, -149, -20, -149]
    assert g.stated_bounds(h) == rule(h)
    assert g.stated_bounds(h, 5) == rule(h, 5) and g.stated_bounds(h, -30) == rule(h, -30)
    assert g.stated_bounds(h, 5)[1] == 5 + m and g.stated_bounds(h, 5)[3] == -149 + m
    prev, obs = [-10, -149, 0, 7], [-12, -149, 3, -149]
    assert g.next_history(prev, obs) == [max(o, max(p - d, -149)) for p, o in zip(prev, obs)]
    assert g.next_history(None, obs) == obs
    with pytest.raises(bitexact.InvalidArgumentError, match="'top' needs a history"):
        g.stated_bounds(None, 3)
    with pytest.raises(bitexact.InvalidArgumentError,
                       match=r"'history\[1\]' \(a gradient tensor\) is 200"):
        g.stated_bounds([0, 200, 0, 0])
    with pytest.raises(bitexact.InvalidArgumentError, match="'observed': 3 values, 4 expected"):
        g.next_history(None, [0, 0, 0])
    with pytest.raises(bitexact.InvalidArgumentError, match="not all-reduced"):
        g.history()


# ---- python -m bitexact.train against `bitexact train` -----------------------------------

needs_cli = pytest.mark.skipif(not os.access(CLI, os.X_OK),
                               reason=f"the bitexact command is not built ({CLI})")


def _lines(path):
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


@pytest.fixture(scope="module")
def cref(tmp_path_factory):
    """The C trainer: step-0 and step-2 checkpoints, and a straight 4-step
    run's record and checkpoint."""
    d = tmp_path_factory.mktemp("onepass")
    for steps in (0, 2):
        p = _run([CLI, "train", "--steps", str(steps), "--save", str(d / f"ck{steps}"), "-q"])
        assert p.returncode == 0, p.stderr
    p = _run([CLI, "train", "--steps", "4", "--record", str(d / "c.jsonl"), "--save",
              str(d / "ck4"), "--threads", "1", "-q"])
    assert p.returncode == 0, p.stderr
    return d


def _same_ckpt(a, b):
    for f in ("model.safetensors", "optimizer/optimizer.safetensors"):
        assert _hash(os.path.join(a, f)) == _hash(os.path.join(b, f)), f
    with open(os.path.join(a, "trainer_state.json"), "rb") as x, \
            open(os.path.join(b, "trainer_state.json"), "rb") as y:
        assert x.read() == y.read()


@needs_cli
def test_c_records_carry_passes(cref):
    recs = [json.loads(line) for line in _lines(cref / "c.jsonl")]
    assert [r["passes"] for r in recs] == [2, 1, 1, 1]
    assert all(r["record_format"] == 2 for r in recs)
    keys = list(recs[0])
    assert keys[keys.index("compute_dtype"):] == ["compute_dtype", "passes", "record_format",
                                                   "entropy_rate"]
    with open(cref / "ck2" / "trainer_state.json") as f:
        st = json.load(f)
    assert st["format_version"] == 2 and "loss" in st["grid_history"]
    with open(cref / "ck0" / "trainer_state.json") as f:
        assert "grid_history" not in json.load(f)  # no step observed one yet


@needs_cli
@pytest.mark.parametrize("fw,ranks,extra", [
    pytest.param("torch", 1, ("--micro-batches", "2"), id="torch-mb2"),
    pytest.param("paddle", 1, (), id="paddle"),
    pytest.param("torch", 2, ("--ep", "2"), id="torch-ep2"),
])
def test_resume_c_checkpoint_continues_in_one_pass(cref, tmp_path, fw, ranks, extra):
    """The C trainer's step-2 checkpoint (grid history of every parameter)
    resumed by the binding for steps 2-3: the C trainer's straight run's
    records (passes 1: the history was restored, by name; under --ep 2
    each rank takes its own experts') and its step-4 checkpoint, the grid
    history included (rank 0 gathers the experts it does not hold)."""
    if fw == "paddle":
        pytest.importorskip("paddle")
    rec, ck = _py_train(fw, ranks, str(tmp_path), str(cref / "ck2"), *extra, steps=4)
    got = _lines(rec)
    assert got == _lines(cref / "c.jsonl")[2:]
    assert [json.loads(x)["passes"] for x in got] == [1, 1]
    _same_ckpt(ck, str(cref / "ck4"))


@needs_cli
def test_format_1_checkpoint_resumes_with_two_passes(cref, tmp_path):
    """A format_version 1 checkpoint (no grid history) is read by both
    trainers; its first resumed step takes the fallback's 2 passes, the
    next one 1; the binding's records and checkpoint equal the C trainer's
    from the same checkpoint (written as format 2, with the history)."""
    old = tmp_path / "ck2v1"
    shutil.copytree(cref / "ck2", old)
    with open(old / "trainer_state.json") as f:
        st = json.load(f)
    del st["grid_history"]
    st["format_version"] = 1
    with open(old / "trainer_state.json", "w") as f:
        f.write(json.dumps(st, indent=2, sort_keys=True) + "\n")
    c_rec, c_ck = str(tmp_path / "c.jsonl"), str(tmp_path / "cck")
    p = _run([CLI, "train", "--resume", str(old), "--steps", "4", "--record", c_rec, "--save",
              c_ck, "--threads", "1", "-q"])
    assert p.returncode == 0, p.stderr
    out = tmp_path / "py"
    out.mkdir()
    rec, ck = _py_train("torch", 1, str(out), str(old), steps=4)
    assert _lines(rec) == _lines(c_rec)
    assert [json.loads(x)["passes"] for x in _lines(rec)] == [2, 1]
    _same_ckpt(ck, c_ck)
    with open(os.path.join(ck, "trainer_state.json")) as f:
        st = json.load(f)
    assert st["format_version"] == 2 and len(st["grid_history"]) > 10


@needs_cli
def test_grid_history_off_is_the_c_trainers(cref, tmp_path):
    """--grid-history off: every step takes the fallback's 2 passes, in both
    trainers, with the same records and checkpoint."""
    c_rec, c_ck = str(tmp_path / "c.jsonl"), str(tmp_path / "cck")
    p = _run([CLI, "train", "--steps", "3", "--grid-history", "off", "--record", c_rec,
              "--save", c_ck, "--threads", "1", "-q"])
    assert p.returncode == 0, p.stderr
    out = tmp_path / "py"
    out.mkdir()
    rec, ck = _py_train("torch", 1, str(out), str(cref / "ck0"), "--grid-history", "off",
                        "--micro-batches", "4", steps=3)
    assert _lines(rec) == _lines(c_rec)
    assert [json.loads(x)["passes"] for x in _lines(rec)] == [2, 2, 2]
    _same_ckpt(ck, c_ck)


def _edit_history(st, how):
    gh = st["grid_history"]
    if how == "missing":
        del gh["lm_head.weight"]
        return "lm_head.weight"
    if how == "extra":
        gh["model.layers.9.mlp.up_proj.weight"] = 0
        return "model.layers.9.mlp.up_proj.weight"
    if how == "float":
        gh["model.norm.weight"] = 1.5
        return "model.norm.weight"
    if how == "range":
        gh["loss"] = 129
        return "loss"
    st["grid_history"] = [1, 2]
    return "grid_history"


@needs_cli
@pytest.mark.parametrize("how", ["missing", "extra", "float", "range", "not-object"])
def test_bad_grid_history_is_refused_naming_the_key(cref, tmp_path, how):
    """A grid_history without a parameter, with an unknown key, a
    non-integer or out-of-range exponent, or not an object: the binding
    exits 2 with one line naming the key (and the C trainer refuses it
    too)."""
    bad = tmp_path / "ck"
    shutil.copytree(cref / "ck2", bad)
    with open(bad / "trainer_state.json") as f:
        st = json.load(f)
    key = _edit_history(st, how)
    with open(bad / "trainer_state.json", "w") as f:
        json.dump(st, f)
    p = _run([sys.executable, "-m", "bitexact.train", "--framework", "torch", "--resume",
              str(bad), "--steps", "3", "-q"])
    assert p.returncode == 2, p.stderr
    assert key in p.stderr and p.stderr.count("\n") == 1, p.stderr
    c = _run([CLI, "train", "--resume", str(bad), "--steps", "3", "-q"])
    assert c.returncode != 0 and "grid_history" in c.stderr, c.stderr
