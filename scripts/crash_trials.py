#!/usr/bin/env python3
"""Crash-consistency trials of `bitexact train` and `python -m bitexact.train`
(issue 29 item 3; docs/restart.md).

Each trial starts a run `--steps N --save D --save-every 1 --record R`,
kills it with SIGKILL (one process, or one rank of `mpirun -np P`) at a
moment drawn from --seed, waits for everything to exit (a hang is a
FAILURE), then judges D:

- no D: "no checkpoint yet", allowed only while no save can have finished
  (fewer than 2 complete record lines; a record line is written after its
  step and flushed before the next save);
- D holds step k: k within what the record shows (L - 1 <= k <= L for L
  complete lines), the record lines equal the uninterrupted run's, and, for
  the C trainer, D's files equal the reference checkpoint of step k byte
  for byte (trainer_state.json with its total_steps, which the references
  of `--steps k` set to k, put back); then `--resume D --save D` to step N
  must exit 0, its records must equal the uninterrupted run's steps k ..
  N-1 byte for byte, the final checkpoint's tensors must equal the
  uninterrupted run's (`bitexact hash`, and for the C trainer every file
  byte for byte), and no D.tmp-* may be left.

Outcomes: "resumed from step k" (D held the checkpoint of the last save),
"previous checkpoint kept" (a save was interrupted: a D.tmp-* with a torn
or newer checkpoint was left and D held the one before; resumed bit for bit
too), "no checkpoint yet"
(restarted from scratch, or from --init-ckpt), "finished" (killed after the
final save: D equals the uninterrupted run's), FAILURE.

Kill moments, drawn per trial from --seed:
- "time": uniformly in [0, T] of the measured wall time T of a whole run;
- "save": a uniform delay in [0, S] after a D.tmp-* appears (S the
  measured longest save), from a uniform start in [0, T]: inside the
  writer;
- "hook": the test hook BITEXACT_TEST_CKPT_KILL=POINT:n (the writer kills
  itself at a named point of its n-th pass there: st_write.h);
- "stop" (with --np > 1): BITEXACT_TEST_CKPT_STOP=POINT:n stops rank 0
  inside the writer, then another rank is killed.
With --np > 1 the "time" and "save" kills hit a rank drawn uniformly.

    python3 scripts/crash_trials.py --bin build/bitexact --trials 200 --seed 1
    python3 scripts/crash_trials.py --bin build/bitexact --np 4 --trials 50 --seed 2
    python3 scripts/crash_trials.py --bin build/bitexact --trainer torch --trials 20

Prints one line per trial and the counts; exits 1 on any FAILURE.
"""
import argparse
import collections
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

POINTS = ("tmpdir", "config", "torn", "model", "optimizer", "state", "synced", "renamed", "done")
TINY = ("--seq-len", "16", "--global-batch", "4")


class Failure(Exception):
    pass


class Driver:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.bin)
        self.work = a.work or tempfile.mkdtemp(prefix="bx_crash_")
        os.makedirs(self.work, exist_ok=True)
        self.args = list(TINY if not a.config else ("--config", a.config, *TINY))
        if a.extra:
            self.args += a.extra.split()
        if a.ep > 1:
            self.args += ["--ep", str(a.ep)]
        self.rng = random.Random(a.seed)

    # ---- launching --------------------------------------------------------

    def cmd(self, *args):
        a = self.a
        args = [str(x) for x in args]
        if a.trainer == "c":
            base = [self.bin, "train", *self.args, *args]
        else:
            base = [sys.executable, "-m", "bitexact.train", "--framework", a.trainer, *self.args,
                    *args]
        if a.np > 1:
            mp = ["mpirun", "--oversubscribe", "-np", str(a.np)]
            if os.geteuid() == 0:
                mp.insert(1, "--allow-run-as-root")
            for v in ("BITEXACT_TEST_CKPT_KILL", "BITEXACT_TEST_CKPT_STOP"):
                mp += ["-x", v]
            return mp + base
        return base

    def env(self, extra=None):
        e = dict(os.environ)
        e.pop("BITEXACT_TEST_CKPT_KILL", None)
        e.pop("BITEXACT_TEST_CKPT_STOP", None)
        e.update(extra or {})
        if self.a.np > 1:  # Open MPI's own allocations are not the command's leaks (sanitizer builds)
            e["ASAN_OPTIONS"] = "detect_leaks=0:" + e.get("ASAN_OPTIONS", "")
        return e

    def run_ok(self, *args, env=None):
        p = subprocess.run(self.cmd(*args, "-q"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=self.env(env), timeout=self.a.timeout)
        if p.returncode != 0:
            raise Failure("exit %d: %s" % (p.returncode, p.stderr.decode()[-800:]))
        return p

    def start_args(self):
        """The flags of a fresh run (the Python trainers start from the
        C trainer's step-0 checkpoint)."""
        return ["--resume", self.ck0] if self.a.trainer != "c" else []

    # ---- references -------------------------------------------------------

    def prepare(self):
        a, w = self.a, self.work
        self.ck0 = os.path.join(w, "ck0")
        if a.trainer != "c":  # the Python trainers resume the C trainer's initial model
            subprocess.run([self.bin, "train", *self.args, "--steps", "0", "--save", self.ck0,
                            "-q"], check=True, stdout=subprocess.PIPE)
        self.ref_rec = os.path.join(w, "ref.jsonl")
        self.ref_ck = os.path.join(w, "ref_ck")
        t0 = time.time()
        save = os.path.join(w, "ref_save")
        p = subprocess.Popen(self.cmd(*self.start_args(), "--steps", a.steps, "--record",
                                      self.ref_rec, "--save", save, "--save-every", "1", "-q"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env())
        longest, seen = 0.0, None
        while p.poll() is None:  # the longest save: how long a D.tmp-* lives
            now = time.time()
            tmp = glob.glob(save + ".tmp-*")
            if tmp and seen is None:
                seen = now
            elif not tmp and seen is not None:
                longest, seen = max(longest, now - seen), None
            time.sleep(0.0005)
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit("reference run failed: " + err.decode()[-800:])
        self.T = time.time() - t0
        self.S = max(longest, 0.002)
        shutil.move(save, self.ref_ck)
        with open(self.ref_rec, "rb") as f:
            self.ref_lines = f.read().splitlines(keepends=True)
        assert len(self.ref_lines) == a.steps, (len(self.ref_lines), a.steps)
        self.ref_hash = self.hashes(self.ref_ck)
        # the checkpoint after k steps (C trainer): --steps k --save
        self.step_ck = {}
        if a.trainer == "c" and not a.no_step_refs:
            for k in range(1, a.steps):
                d = os.path.join(w, "ref_step%d" % k)
                self.run_ok("--steps", k, "--save", d)
                self.step_ck[k] = d
        print("reference: %d steps, run %.2f s, longest save %.4f s, work %s"
              % (a.steps, self.T, self.S, w), flush=True)

    # ---- comparisons ------------------------------------------------------

    def hashes(self, d):
        files = sorted(glob.glob(os.path.join(d, "*.safetensors")) +
                       glob.glob(os.path.join(d, "optimizer", "*.safetensors")))
        out = []
        for f in files:
            p = subprocess.run([self.bin, "hash", f], stdout=subprocess.PIPE, check=True)
            out += p.stdout.decode().splitlines()
        return sorted(out)

    @staticmethod
    def files(d):
        out = {}
        for root, _, names in os.walk(d):
            for n in names:
                p = os.path.join(root, n)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, d)] = f.read()
        return out

    def same_as_step(self, d, k):
        """D's files equal the reference checkpoint of step k (C trainer)."""
        ref = self.files(self.step_ck[k])
        got = self.files(d)
        if set(ref) != set(got):
            raise Failure("step %d: files %s, reference %s" % (k, sorted(got), sorted(ref)))
        for n in ref:
            r, g = ref[n], got[n]
            if n == "trainer_state.json":
                js = json.loads(r)
                js["lr_schedule"]["total_steps"] = self.a.steps
                r = (json.dumps(js, indent=2, sort_keys=True) + "\n").encode()
            if r != g:
                raise Failure("step %d: %s differs from the reference checkpoint" % (k, n))

    # ---- one trial ----------------------------------------------------------

    def ranks(self, p):
        """{rank: pid} of mpirun p's ranks (its children with OMPI_COMM_WORLD_RANK)."""
        out = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != p.pid:
                    continue
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            for e in env:
                if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                    out[int(e.split(b"=", 1)[1])] = int(pid)
        return out

    def kill_one(self, p, rank):
        """SIGKILL the process (one rank under mpirun: rank, or any rank
        running when that one is not). Returns the rank killed or None."""
        if self.a.np == 1:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                return None
            return 0
        r = self.ranks(p)
        while len(r) < self.a.np and p.poll() is None:  # not every rank started yet
            time.sleep(0.001)
            r = self.ranks(p)
        if not r:
            return None
        rank = rank if rank in r else sorted(r)[0]
        try:
            os.kill(r[rank], signal.SIGKILL)
        except ProcessLookupError:
            return None
        return rank

    def trial(self, i):
        self.last = "?"
        a, w, rng = self.a, self.work, self.rng
        d, rec = os.path.join(w, "D"), os.path.join(w, "R.jsonl")
        for x in glob.glob(d + "*") + [rec, os.path.join(w, "R2.jsonl")]:
            shutil.rmtree(x) if os.path.isdir(x) else os.remove(x) if os.path.exists(x) else None
        modes = ["time", "save", "hook"] + (["stop"] if a.np > 1 else [])
        mode = rng.choice(modes)
        rank = rng.randrange(a.np)
        env, what = {}, ""
        if mode in ("hook", "stop"):
            pt = rng.choice(POINTS)
            # passes: one per save (steps 1 .. N-1 and the final one), torn: 2 files a save
            n = rng.randint(1, a.steps * (2 if pt == "torn" else 1))
            env["BITEXACT_TEST_CKPT_" + ("KILL" if mode == "hook" else "STOP")] = "%s:%d" % (pt, n)
            what = "%s:%d" % (pt, n)
            if mode == "stop":
                rank = rng.randrange(1, a.np)
        self.last = mode + " " + what
        t_kill = rng.uniform(0, self.T)
        t_in = rng.uniform(0, self.S)
        p = subprocess.Popen(self.cmd(*self.start_args(), "--steps", a.steps, "--record", rec,
                                      "--save", d, "--save-every", "1", "-q"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env(env),
                             start_new_session=True)
        t0 = time.time()
        killed = None
        try:
            if mode == "time":
                while p.poll() is None and time.time() - t0 < t_kill:
                    time.sleep(0.0005)
                killed = self.kill_one(p, rank)
                what = "t=%.3fs rank %s" % (time.time() - t0, killed)
            elif mode == "save":
                while p.poll() is None and time.time() - t0 < t_kill:
                    time.sleep(0.001)
                while p.poll() is None and not glob.glob(d + ".tmp-*"):
                    time.sleep(0.0002)
                t1 = time.time()
                while p.poll() is None and time.time() - t1 < t_in:
                    time.sleep(0.0002)
                killed = self.kill_one(p, rank)
                what = "save+%.4fs rank %s" % (time.time() - t1, killed)
            elif mode == "stop":
                # rank 0 stops itself inside the writer; then another rank dies
                while p.poll() is None:
                    r = self.ranks(p)
                    if 0 in r:
                        try:
                            with open("/proc/%d/stat" % r[0]) as f:
                                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                                    break
                        except OSError:
                            pass
                    time.sleep(0.001)
                killed = self.kill_one(p, rank)
                what += " rank %s" % killed
            try:
                p.communicate(timeout=a.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                raise Failure("HANG: the run did not exit %d s after the kill" % a.timeout)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if a.np > 1:  # nothing of the run may be left
            t1 = time.time()
            while True:  # the ranks mpirun tore down: gone (zombies are dead) within 10 s
                left = [pid for pid in os.listdir("/proc")
                        if pid.isdigit() and self._in_session(pid, p.pid)]
                if not left or time.time() - t1 > 10:
                    break
                time.sleep(0.01)
            if left:
                desc = []
                for pid in left:
                    try:
                        with open("/proc/%s/stat" % pid) as f:
                            desc.append(f.read()[:80])
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
                raise Failure("HANG: processes of the run left after mpirun exited: %s" % desc)
        return mode, what, self.judge(d, rec, p.returncode)

    @staticmethod
    def _in_session(pid, sid):
        """pid is a live (not zombie) process of session sid."""
        try:
            with open("/proc/%s/stat" % pid) as f:
                st = f.read().rsplit(")", 1)[1].split()
            return st[0] != "Z" and int(st[3]) == sid
        except (OSError, ValueError, IndexError):
            return False

    def judge(self, d, rec, rc):
        a = self.a
        lines = []
        if os.path.exists(rec):
            with open(rec, "rb") as f:
                lines = [ln for ln in f.read().splitlines(keepends=True) if ln.endswith(b"\n")]
        if lines != self.ref_lines[:len(lines)]:
            raise Failure("the killed run's record differs from the reference")
        L = len(lines)
        tmp_left = glob.glob(d + ".tmp-*")
        if not os.path.isdir(d):
            if L >= 2:
                raise Failure("no checkpoint in D, but %d record lines (a save had finished)" % L)
            outcome, k = "no checkpoint yet", 0
            start = self.start_args()
        else:
            try:
                with open(os.path.join(d, "trainer_state.json")) as f:
                    k = json.load(f)["step"]
            except (OSError, ValueError, KeyError) as e:
                raise Failure("D is torn: trainer_state.json: %s" % e)
            if not (L - 1 <= k <= L) or k < 1:
                raise Failure("D holds step %d, the record %d lines" % (k, L))
            if k < a.steps and k in self.step_ck:
                self.same_as_step(d, k)
            def tmp_step(t):
                try:
                    with open(os.path.join(t, "trainer_state.json")) as f:
                        return json.load(f)["step"]
                except (OSError, ValueError, KeyError):
                    return None  # a save cut short
            # a D.tmp-* holding an older step: the old checkpoint, swapped out, not yet removed
            cut = [t for t in tmp_left if tmp_step(t) is None or tmp_step(t) > k]
            if k == a.steps:
                outcome = "finished"
            elif cut:
                outcome = "previous checkpoint kept"
            else:
                outcome = "resumed from step k"
            start = ["--resume", d]
        rec2 = os.path.join(self.work, "R2.jsonl")
        if k < a.steps:
            self.run_ok(*start, "--steps", a.steps, "--record", rec2, "--save", d,
                        "--save-every", "1")
            with open(rec2, "rb") as f:
                got = f.read().splitlines(keepends=True)
            if got != self.ref_lines[k:]:
                raise Failure("the resumed run's record differs from the reference's steps %d.." % k)
            if glob.glob(d + ".tmp-*"):
                held = []
                for t in glob.glob(d + ".tmp-*"):  # who holds it (a live writer's flock?)
                    for pid in os.listdir("/proc"):
                        try:
                            for fd in os.listdir("/proc/%s/fd" % pid):
                                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == t:
                                    held.append((t, pid))
                        except OSError:
                            pass
                raise Failure("stale (held by %s) %s left after the resumed run's saves" % (held, [
                    (t, sorted(os.listdir(t))) for t in glob.glob(d + ".tmp-*")]))
        if self.hashes(d) != self.ref_hash:
            raise Failure("the final checkpoint's tensors differ from the reference's")
        if a.trainer == "c" and self.files(d) != self.files(self.ref_ck):
            raise Failure("the final checkpoint's files differ from the reference's")
        return outcome, k


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bitexact")
    ap.add_argument("--trainer", choices=("c", "torch", "paddle"), default="c")
    ap.add_argument("--np", type=int, default=1, help="ranks (mpirun; C trainer only)")
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--config", default=None, help="config.json (default: the tiny built-in)")
    ap.add_argument("--extra", default="", help="more flags of the run, e.g. '--save-max-shard-size 1MB'")
    ap.add_argument("--timeout", type=int, default=120, help="seconds a run may take after a kill")
    ap.add_argument("--work", default=None)
    ap.add_argument("--no-step-refs", action="store_true",
                    help="skip the per-step reference checkpoints (big configs)")
    a = ap.parse_args()
    if a.np > 1 and a.trainer != "c":
        ap.error("--np > 1 only with the C trainer")
    dr = Driver(a)
    dr.prepare()
    counts = collections.Counter()
    kinds = collections.Counter()
    fails = 0
    t0 = time.time()
    for i in range(a.trials):
        try:
            mode, what, (outcome, k) = dr.trial(i)
            counts[outcome] += 1
            kinds[(mode, outcome)] += 1
            print("trial %3d %-5s %-28s %s%s" % (i, mode, what, outcome,
                                                 "" if outcome == "no checkpoint yet" else " (step %d)" % k),
                  flush=True)
        except (Failure, subprocess.TimeoutExpired) as e:
            fails += 1
            counts["FAILURE"] += 1
            print("trial %3d FAILURE (seed %d, %s): %s" % (i, a.seed, dr.last, e), flush=True)
    print("trials %d (seed %d, %s, np %d, ep %d, %d steps, %.0f s): %s" % (
        a.trials, a.seed, a.trainer, a.np, a.ep, a.steps, time.time() - t0,
        ", ".join("%s %d" % kv for kv in sorted(counts.items()))))
    for (mode, outcome), c in sorted(kinds.items()):
        print("  %-5s %-26s %d" % (mode, outcome, c))
    if not a.work:
        shutil.rmtree(dr.work, ignore_errors=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
