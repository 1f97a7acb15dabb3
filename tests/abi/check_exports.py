#!/usr/bin/env python3
"""check_exports.py — a shared library exports exactly the public API.

    check_exports.py --lib LIB [--soname NAME] HEADER...

The public API is every function declared with BX_API in the given headers
(include/bitexact*.h). The library's dynamic symbol table (nm -D
--defined-only) must hold each of them as a function and nothing else:
no internal bx_ function, no symbol of the static CUDA runtime, libstdc++
or the compiler. With --soname, the library's DT_SONAME must be NAME.
Prints the differences; the last line is "N passed, N failed".
"""
import argparse
import re
import subprocess
import sys

DECL = re.compile(r"\bBX_API\b[^;{]*?\b(bx_[A-Za-z0-9_]+)\s*\(", re.S)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def declared(headers):
    names = set()
    for h in headers:
        with open(h, encoding="utf-8") as f:
            text = COMMENT.sub(" ", f.read())
        # the macro's own definition is not a declaration
        text = re.sub(r"^\s*#\s*define\s+BX_API\b.*$", "", text, flags=re.M)
        names |= set(DECL.findall(text))
    return names


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            syms[parts[2].split("@")[0]] = parts[1]
    return syms


def soname(lib):
    out = subprocess.run(["readelf", "-d", lib], check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--soname")
    ap.add_argument("headers", nargs="+")
    args = ap.parse_args()
    want = declared(args.headers)
    have = exported(args.lib)
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            print("FAIL", what)

    check(len(want) > 0, f"no BX_API declaration found in {args.headers}")
    for name in sorted(want):
        check(have.get(name) == "T", f"{name}: declared BX_API but "
              + ("not exported" if name not in have else f"exported as type {have[name]}"))
    for name in sorted(set(have) - want):
        check(False, f"{name} ({have[name]}): exported but not public API")
    if args.soname:
        got = soname(args.lib)
        check(got == args.soname, f"SONAME is {got}, not {args.soname}")
    print(f"{args.lib}: {len(want)} public functions, {len(have)} exported symbols")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
