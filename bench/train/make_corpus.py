#!/usr/bin/env python3
"""bench/train/make_corpus.py — a token corpus from text this machine
already has (no download): the top-level modules of Python's standard
library (``sysconfig.get_paths()["stdlib"]/*.py``, sorted by name), a
byte-level BPE of --vocab tokens trained on them with Hugging Face
``tokenizers`` (a transformers dependency), written as nanoGPT-style raw
little-endian uint16 files that ``bitexact train --data`` reads:

    OUT/train.bin   the files but every 20th, in name order
    OUT/eval.bin    every 20th file (held out)
    OUT/corpus.json the source, counts and SHA-256 of both

    python3 bench/train/make_corpus.py --out build/corpus [--vocab 8192]

The BPE trainer runs on one thread (RAYON_NUM_THREADS=1) so the merges,
hence the files, are the same on every run of the same Python and
tokenizers versions (corpus.json names them)."""
import argparse
import glob
import hashlib
import json
import os
import sys
import sysconfig

os.environ.setdefault("RAYON_NUM_THREADS", "1")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, default=8192)
    a = p.parse_args(argv)
    if not 256 < a.vocab <= 65536:
        sys.exit("make_corpus.py: --vocab must be in (256, 65536] (uint16 ids)")
    try:
        import numpy as np
        from tokenizers import ByteLevelBPETokenizer
    except ImportError as e:
        sys.exit(f"make_corpus.py: {e} (scripts/py_setup.sh installs numpy and transformers)")
    src = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(src, "*.py")))
    if len(files) < 40:
        sys.exit(f"make_corpus.py: only {len(files)} modules in {src}")
    texts = [open(f, encoding="utf-8", errors="replace").read() for f in files]
    held = set(range(19, len(files), 20))
    train = [t for i, t in enumerate(texts) if i not in held]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(train, vocab_size=a.vocab, min_frequency=2, show_progress=False)
    os.makedirs(a.out, exist_ok=True)
    info = {"source": src, "python": sys.version.split()[0], "modules": len(files),
            "held_out_modules": len(held), "vocab": a.vocab}
    import tokenizers
    info["tokenizers"] = tokenizers.__version__
    for name, parts in (("train", train), ("eval", [texts[i] for i in sorted(held)])):
        ids = []
        for t in parts:
            ids.extend(tok.encode(t).ids)
        arr = np.asarray(ids, dtype="<u2")
        assert arr.max() < a.vocab
        path = os.path.join(a.out, name + ".bin")
        arr.tofile(path)
        info[name] = {"tokens": int(arr.size), "bytes_of_text": sum(len(t.encode()) for t in parts),
                      "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
    with open(os.path.join(a.out, "corpus.json"), "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
    print(json.dumps(info, sort_keys=True))


if __name__ == "__main__":
    main()
