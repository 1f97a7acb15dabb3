"""Golden runs of `bitexact train`: the bits of today's trainer, kept in
tests/golden/train.json, so that moving the model (issue 25: the trainer
becomes a library module, the bindings call it) can be shown to move no bit.

Each case is one configuration (the tiny built-in config in fp32 and in bf16
compute; a second config with QK-norm, three layers, routed scaling 2.5, a
.npy corpus and --shuffle) trained for a few steps on several layouts (1
process with 1-4 micro-batches and 1-2 threads; mpirun -np 2 and 4 with
--ep 1/2/4). Every layout must give the same run record (every line, as
JSON) and the same canonical checkpoint hashes (`bitexact hash`: model and
optimizer state) as the golden file: layout invariance and "bits do not
move" in one check. The torch and Paddle trainers are compared with
`bitexact train` itself by tests/python/test_train_bindings.py, so they are
held to these bits too.

The golden file is written by the trainer, never by hand:
    BX_GOLDEN_WRITE=1 python3 tests/cli/test_cli.py --bin build/bitexact --mpi -k golden
(a deliberate change of the numerics rewrites it in the same commit, and
says so). Layouts under mpirun are skipped without MPI."""
import json
import os

from harness import *  # noqa: F401,F403 - the shared helpers and data

from cases_train import mpirun_train, records, tpath

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "train.json")
STEPS = "3"


def _splitmix_tokens(n, vocab, seed):
    """n token ids in [0, vocab) from splitmix64 (a corpus that no library
    version changes), as a little-endian uint16 .npy file's bytes."""
    m64 = (1 << 64) - 1
    out, z = bytearray(), seed & m64
    for _ in range(n):
        z = (z + 0x9E3779B97F4A7C15) & m64
        x = z
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m64
        x ^= x >> 31
        out += (x % vocab).to_bytes(2, "little")
    header = "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }" % n
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(out)


def _qk_config():
    """The second config: the tiny one with QK-norm, 3 layers, routed
    scaling 2.5 and a 512-token vocabulary, and its corpus."""
    base = tpath("golden_base")
    rc, out, err = run("train", "--steps", "0", "--save", base, "-q")
    assert rc == 0, err
    with open(os.path.join(base, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(use_qk_norm=True, num_hidden_layers=3, routed_scaling_factor=2.5, vocab_size=512)
    c, d = tpath("golden_qk.json"), tpath("golden_qk.npy")
    with open(c, "w") as f:
        json.dump(cfg, f)
    with open(d, "wb") as f:
        f.write(_splitmix_tokens(20000, 512, 1))
    return ["--config", c, "--data", d, "--shuffle", "--seq-len", "32", "--global-batch", "4"]


TINY = ["--seq-len", "16", "--global-batch", "8"]
# case -> (flags, [(ranks, extra layout flags)])
CASES = {
    "tiny-fp32": (TINY, [(1, []), (1, ["--micro-batches", "4", "--threads", "2"]),
                         (2, ["--ep", "2", "--micro-batches", "2"]), (4, ["--ep", "4"]),
                         (4, ["--ep", "1", "--micro-batches", "2"])]),
    "tiny-bf16": (TINY + ["--compute-dtype", "bf16"],
                  [(1, []), (1, ["--micro-batches", "2"]), (2, ["--ep", "2"]),
                   (4, ["--ep", "4", "--micro-batches", "2"])]),
    "qk-shuffle-fp32": (None, [(1, []), (1, ["--micro-batches", "2"]),
                               (2, ["--ep", "2", "--micro-batches", "2"])]),
    # the one-pass step's fallback forced (every step on its observed grid, two passes)
    "tiny-fp32-fallback": (TINY + ["--grid-history", "off"],
                           [(1, []), (1, ["--micro-batches", "4", "--threads", "2"]),
                            (2, ["--ep", "2", "--micro-batches", "2"]), (4, ["--ep", "4"])]),
}


def _checkpoint_hash(f):
    rc, out, err = run("hash", f, "--json")
    assert rc == 0, err
    return json.loads(out)["checkpoint"]


def _one_run(case, flags, ranks, layout):
    tag = "%s_%d_%s" % (case, ranks, "_".join(a.strip("-") for a in layout) or "plain")
    rec, ck = tpath("golden_%s.jsonl" % tag), tpath("golden_ck_%s" % tag)
    args = [*flags, "--steps", STEPS, "--record", rec, "--save", ck, *layout]
    if ranks == 1:
        rc, out, err = run("train", *args, "-q")
        assert rc == 0, (case, layout, err)
    else:
        p = mpirun_train(ranks, *args, "-q")
        assert p.returncode == 0, (case, ranks, layout, p.stderr.decode()[-2000:])
    return {"records": records(rec),
            "model": _checkpoint_hash(os.path.join(ck, "model.safetensors")),
            "optimizer": _checkpoint_hash(os.path.join(ck, "optimizer", "optimizer.safetensors"))}


@test
def train_golden_bits():
    write_mode = os.environ.get("BX_GOLDEN_WRITE") == "1"
    golden = {}
    if not write_mode:
        with open(GOLDEN) as f:
            golden = json.load(f)
        assert sorted(golden["cases"]) == sorted(CASES), sorted(golden["cases"])
    got = {}
    skipped = []
    for case, (flags, layouts) in CASES.items():
        if flags is None:
            flags = _qk_config()
        for ranks, layout in layouts:
            try:
                res = _one_run(case, flags, ranks, layout)
            except Skip as s:  # no MPI in this build: the 1-process layouts still count
                skipped.append((case, ranks, str(s)))
                continue
            want = got.setdefault(case, res) if write_mode else golden["cases"][case]
            where = "%s on %d rank(s) %s" % (case, ranks, " ".join(layout))
            for k, (a, b) in enumerate(zip(res["records"], want["records"])):
                assert a == b, "%s: record line %d moved:\n got  %s\n want %s" % (where, k, a, b)
            assert len(res["records"]) == len(want["records"]), where
            for name in ("model", "optimizer"):
                assert res[name] == want[name], "%s: %s checkpoint hash %s, golden %s" % (
                    where, name, res[name], want[name])
    if write_mode:
        with open(GOLDEN, "w") as f:
            json.dump({"about": "bitexact train's bits; written by tests/cli/cases_golden.py "
                                "(BX_GOLDEN_WRITE=1), never by hand",
                       "steps": int(STEPS), "cases": got}, f, indent=1, sort_keys=True)
            f.write("\n")
    if skipped and not Ctx.mpi:
        raise Skip("layouts under mpirun not run (built without MPI); 1-process layouts match")
