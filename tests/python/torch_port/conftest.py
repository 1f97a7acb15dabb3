"""The port of PyTorch's clip tests (docs/torch_port.md). pytest imports
these files with tests/python/torch_port/ on sys.path; the shared helpers
(helpers.py, exact_ref.py) live one level up, so that directory is added
too. The spawned workers inherit sys.path from the test process."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _d in (_HERE, os.path.dirname(_HERE)):
    if _d not in sys.path:
        sys.path.insert(0, _d)
