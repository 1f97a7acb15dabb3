"""``python -m bitexact.train`` as a script file, for launchers that take a
path instead of a module (paddle.distributed.launch)::

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        "$(python -c 'import bitexact.scripts as s; print(s.TRAIN)')" --framework paddle ...

It lives in its own directory: run as a script, its directory goes first
on sys.path, and bitexact's own torch/ and paddle/ must not shadow the
frameworks there."""

from bitexact.train._run import exit_process, main

if __name__ == "__main__":
    exit_process(main())
