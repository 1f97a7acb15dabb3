"""``python -m bitexact.train`` as a script file, for launchers that take a
path (paddle.distributed.launch): tests/python/test_train_bindings.py."""
import sys

from bitexact._glm_run import main

if __name__ == "__main__":
    sys.exit(main())
