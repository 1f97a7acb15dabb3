#!/usr/bin/env python3
"""ptx_lint.py — the PTX lint of the training kernels (issue 30, S1).

Compiles each src/cuda/train/*.cu to PTX with the library's device flags
(--fmad=false, no fast math) for every architecture the build targets
(sm_80 and sm_90), then fails when

  * any instruction is approximate or flushes subnormals: `.approx`
    (rcp/ex2/lg2/sqrt/div/sin/cos.approx), `.ftz`, or `div.full`;
  * the count of `fma.rn.f32` / `fma.rn.f64` of a kernel (an .entry, or a
    .func left out of line) differs from src/cuda/train/fma_manifest.json:
    every fused multiply-add must be an explicit bx_fmaf of the shared
    headers, so a change of that count is a change of the arithmetic to
    review (the message names the kernel and both counts; --update writes
    the manifest after such a review).

--self-test shows that the lint can fail: a planted __fdividef (div.approx)
and a planted contraction (a*b+c compiled without --fmad=false) must both
be refused, and a manifest off by one must be reported.

The last line is "N passed, N failed" (scripts/test.sh counts it).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "src", "cuda", "train")
MANIFEST = os.path.join(TRAIN, "fma_manifest.json")
ARCHS = ["sm_80", "sm_90"]
FORBIDDEN = [
    (re.compile(r"\.approx\b"), ".approx"),
    (re.compile(r"\.ftz\b"), ".ftz"),
    (re.compile(r"\bdiv\.full\b"), "div.full"),
]
FMA = {"f32": re.compile(r"\bfma\.rn\.f32\b"), "f64": re.compile(r"\bfma\.rn\.f64\b")}
FUNC_HEAD = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)")


def demangle(name):
    """The identifier of an Itanium-mangled name (_Z<len><id>...), else name."""
    m = re.match(r"_Z(\d+)", name)
    if m:
        n = int(m.group(1))
        start = m.end()
        return name[start:start + n]
    return name


def default_includes():
    inc = [os.path.join(ROOT, d) for d in
           ("include", "src/common", "src/core", "src/train", "src/cuda", "src/cuda/train")]
    cache = os.path.join(ROOT, "build", "CMakeCache.txt")
    dl = "/usr/include"
    if os.path.exists(cache):
        for line in open(cache, encoding="utf-8", errors="replace"):
            if line.startswith("BX_DLPACK_INCLUDE_DIR:"):
                dl = line.split("=", 1)[1].strip()
    inc.append(dl)
    return inc


def compile_ptx(nvcc, src, arch, includes, out, extra=None):
    cmd = [nvcc, "-ptx", "-arch=" + arch, "-std=c++17", "-O2", "--fmad=false",
           "-DBX_HAVE_CUDA=1", "-D_GNU_SOURCE", "-o", out, src]
    if extra is not None:
        cmd = [c for c in cmd if c != "--fmad=false"] + extra
    for d in includes:
        cmd[1:1] = ["-I", d]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("nvcc failed on %s (%s):\n%s" % (src, arch, r.stdout + r.stderr))


def scan(ptx_text):
    """(forbidden hits [(line no, text, what)], {kernel: {"f32": n, "f64": n}})."""
    bad, counts, cur, depth = [], {}, None, 0
    for no, line in enumerate(ptx_text.splitlines(), 1):
        code = line.split("//", 1)[0]
        m = FUNC_HEAD.match(code)
        if m and depth == 0:
            cur = demangle(m.group(2))
            counts.setdefault(cur, {"f32": 0, "f64": 0})
            depth = 0
        for rx, what in FORBIDDEN:
            if rx.search(code):
                bad.append((no, line.strip(), what))
        if cur is not None:
            for k, rx in FMA.items():
                counts[cur][k] += len(rx.findall(code))
            opened = code.count("{")
            depth += opened - code.count("}")
            if opened and depth == 0 or (depth == 0 and code.strip() == "}"):
                cur = None
            elif depth < 0:
                cur, depth = None, 0
    return bad, counts


def lint(nvcc, sources, includes, manifest, archs, report):
    """Failures (strings) of sources against manifest; the counts found."""
    fails, found = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            base = os.path.basename(src)
            for arch in archs:
                out = os.path.join(tmp, "%s.%s.ptx" % (base, arch))
                compile_ptx(nvcc, src, arch, includes, out)
                bad, counts = scan(open(out).read())
                for no, text, what in bad:
                    fails.append("%s (%s): forbidden %s at PTX line %d: %s" % (base, arch, what, no, text))
                for kern, c in counts.items():
                    found.setdefault(arch, {})["%s:%s" % (base, kern)] = c
    for arch in archs:
        want = manifest.get(arch, {})
        got = found.get(arch, {})
        for key in sorted(set(want) | set(got)):
            w, g = want.get(key), got.get(key)
            if w is None:
                fails.append("%s %s: not in the manifest (counts fma.rn.f32 %d, fma.rn.f64 %d)"
                             % (arch, key, g["f32"], g["f64"]))
            elif g is None:
                fails.append("%s %s: in the manifest but not compiled" % (arch, key))
            elif w != g:
                fails.append("%s %s: fma.rn.f32 %d (manifest %d), fma.rn.f64 %d (manifest %d)"
                             % (arch, key, g["f32"], w["f32"], g["f64"], w["f64"]))
            elif report:
                print("ok %s %s: fma.rn.f32 %d, fma.rn.f64 %d" % (arch, key, g["f32"], g["f64"]))
    return fails, found


def self_test(nvcc, includes):
    """Each planted fault must be refused: [(name, refused)]."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        planted = os.path.join(tmp, "planted.cu")
        with open(planted, "w") as f:
            f.write("__global__ void planted_kernel(float *x) {\n"
                    "  x[threadIdx.x] = __fdividef(x[threadIdx.x], 3.0f);\n}\n")
        out = os.path.join(tmp, "planted.ptx")
        compile_ptx(nvcc, planted, "sm_90", includes, out)
        bad, _ = scan(open(out).read())
        results.append(("a planted __fdividef is refused (div.approx)", bool(bad)))
        contracted = os.path.join(tmp, "contracted.cu")
        with open(contracted, "w") as f:
            f.write("__global__ void contracted_kernel(float *x, const float *y) {\n"
                    "  x[threadIdx.x] = x[threadIdx.x] * y[threadIdx.x] + 1.0f;\n}\n")
        out = os.path.join(tmp, "contracted.ptx")
        compile_ptx(nvcc, contracted, "sm_90", includes, out, extra=["--fmad=true"])
        _, counts = scan(open(out).read())
        manifest = {"sm_90": {"contracted.cu:contracted_kernel": {"f32": 0, "f64": 0}}}
        got = counts.get("contracted_kernel", {"f32": 0})
        results.append(("a contraction (--fmad=true) shows as an fma the manifest lacks",
                        got["f32"] != manifest["sm_90"]["contracted.cu:contracted_kernel"]["f32"]))
        # a manifest off by one on a real kernel is reported
        real = os.path.join(TRAIN, "swiglu.cu")
        m = json.load(open(MANIFEST)) if os.path.exists(MANIFEST) else {}
        m = {"sm_90": dict(m.get("sm_90", {}))}
        key = "swiglu.cu:bx_cut_swiglu_bwd_kernel"
        if key in m["sm_90"]:
            m["sm_90"][key] = dict(m["sm_90"][key], f32=m["sm_90"][key]["f32"] + 1)
        fails, _ = lint(nvcc, [real], includes, m, ["sm_90"], False)
        results.append(("a manifest off by one names the kernel and both counts",
                        any(key in f and "manifest" in f for f in fails)))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    ap.add_argument("--manifest", default=MANIFEST)
    ap.add_argument("--update", action="store_true", help="write the manifest from the counts found")
    ap.add_argument("--self-test", action="store_true", help="check that the lint can fail")
    ap.add_argument("sources", nargs="*")
    a = ap.parse_args()
    includes = default_includes()
    if a.self_test:
        res = self_test(a.nvcc, includes)
        for name, ok in res:
            print(("PASS " if ok else "FAIL ") + name)
        npass = sum(1 for _, ok in res if ok)
        print("%d passed, %d failed" % (npass, len(res) - npass))
        return 0 if npass == len(res) else 1
    sources = a.sources or sorted(os.path.join(TRAIN, f) for f in os.listdir(TRAIN) if f.endswith(".cu"))
    manifest = json.load(open(a.manifest)) if os.path.exists(a.manifest) else {}
    fails, found = lint(a.nvcc, sources, includes, manifest, ARCHS, True)
    if a.update:
        with open(a.manifest, "w") as f:
            json.dump(found, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote %s" % a.manifest)
        return 0
    for f in fails:
        print("FAIL " + f)
    checks = sum(len(v) for v in found.values())
    bad = len(fails)
    print("%d passed, %d failed" % (max(checks - bad, 0), bad))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
