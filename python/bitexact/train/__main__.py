"""``python -m bitexact.train --framework torch|paddle --resume DIR ...``:
`bitexact train`'s loop on a framework binding's GLM-4.5 model
(bitexact.train._run; docs/train_python.md). Exit status 0, or 2 with one
line on stderr for bad input."""

from ._run import exit_process, main

if __name__ == "__main__":
    exit_process(main())
