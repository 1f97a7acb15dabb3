#!/usr/bin/env python3
"""Tests of the `bitexact` command (src/cli/) on real safetensors files.

Files are written by the `safetensors` package from torch tensors and NumPy
arrays (fp32, bf16, fp16, fp64, and integer tensors), or byte by byte by
stfiles.write_raw for orders, padding and corruption. Every norm is compared
bit for bit with an exact reference computed with Python integers
(stfiles.ref_norm), every hash with the documented definition recomputed
with the `xxhash` package. The cases live in cases_*.py; harness.py holds
what they share.

    python3 tests/cli/test_cli.py --bin build/bitexact [--mpi] [-k SUBSTRING]

Prints one line per test and, last, `N passed, N failed[, N skipped]`;
exits non-zero if any test failed. Without torch the torch cases are
skipped.
"""
import argparse
import os
import shutil
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import TESTS, Ctx, Skip  # noqa: E402

# registration order = run order
import cases_norm  # noqa: E402,F401
import cases_hash  # noqa: E402,F401
import cases_diff  # noqa: E402,F401
import cases_bad  # noqa: E402,F401
import cases_demo  # noqa: E402,F401
import cases_train  # noqa: E402,F401
import cases_golden  # noqa: E402,F401
import cases_trace  # noqa: E402,F401
import cases_faults  # noqa: E402,F401
import cases_restart  # noqa: E402,F401
import cases_device  # noqa: E402,F401


# ------------------------------------------------------------- runner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bitexact")
    ap.add_argument("--mpi", action="store_true", help="the binary was built with MPI")
    ap.add_argument("-k", default="", help="run tests whose name contains this")
    args = ap.parse_args()
    Ctx.bin = os.path.abspath(args.bin)
    Ctx.mpi = args.mpi
    if not os.access(Ctx.bin, os.X_OK):
        print(f"test_cli.py: no executable {Ctx.bin} (make cli)", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    Ctx.tmp = tempfile.mkdtemp(prefix="bx_cli_test_")
    passed = failed = skipped = 0
    try:
        for fn in TESTS:
            if args.k not in fn.__name__:
                continue
            try:
                fn()
                print(f"PASS {fn.__name__}", flush=True)
                passed += 1
            except Skip as e:
                print(f"SKIP {fn.__name__}: {e}", flush=True)
                skipped += 1
            except Exception as e:  # noqa: BLE001 - a failing test reports and the run goes on
                print(f"FAIL {fn.__name__}: {e}", flush=True)
                traceback.print_exc(limit=3)
                failed += 1
    finally:
        shutil.rmtree(Ctx.tmp, ignore_errors=True)
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
