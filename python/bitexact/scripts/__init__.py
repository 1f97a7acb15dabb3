"""Script files of bitexact for launchers that take a path: ``TRAIN`` is
``python -m bitexact.train`` (bitexact/scripts/train.py)."""
import os

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
