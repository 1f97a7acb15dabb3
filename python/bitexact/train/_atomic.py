"""Atomic checkpoint directories of ``python -m bitexact.train`` (the rules
of src/cli/train_ckpt.c; docs/restart.md): the files go into a fresh
``DIR.tmp-XXXXXXXX`` that the writer holds an exclusive ``flock`` on, are
fsynced with the directory, and the directory is put in place by one
``rename`` (DIR absent) or one ``renameat2(RENAME_EXCHANGE)`` with the old
checkpoint, which is removed after; the parent is fsynced. So DIR holds a
complete checkpoint at every moment a kill can come. Stale ``DIR.tmp-*``
of killed saves (no live writer holds their lock) are removed before a
save, checkpoint files only.

The test hook of the crash trials (never set in a real run):
BITEXACT_TEST_CKPT_KILL=POINT[:N] kills the process with SIGKILL the N-th
time (default 1) it reaches POINT, BITEXACT_TEST_CKPT_STOP=POINT[:N] stops
it (SIGSTOP): the points of the C writer (st_write.h) but "torn"
(safetensors' ``save_file`` writes a file in one call).
"""
import ctypes
import errno
import fcntl
import glob
import os
import signal

_seen = {}


def test_point(name):
    for var, sig in (("BITEXACT_TEST_CKPT_KILL", signal.SIGKILL),
                     ("BITEXACT_TEST_CKPT_STOP", signal.SIGSTOP)):
        v = os.environ.get(var)
        if not v:
            continue
        pt, _, n = v.partition(":")
        if pt != name:
            continue
        _seen[var] = _seen.get(var, 0) + 1
        if _seen[var] == (int(n) if n else 1):
            os.kill(os.getpid(), sig)


def fsync_path(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(d):
    """Every file under d, then every directory (bottom up), reaches the disk."""
    for root, _, files in os.walk(d, topdown=False):
        for f in files:
            fsync_path(os.path.join(root, f))
        fsync_path(root)


def lock(d):
    """An exclusive flock on directory d, held while the returned fd is open."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
    return fd


def remove_ckpt_dir(d, is_ckpt_file, opt_dir):
    """Removes a checkpoint directory's files (so the rmdir fails on anything else)."""
    for p in (os.path.join(d, opt_dir, "optimizer.safetensors"),):
        try:
            os.unlink(p)
        except OSError:
            pass
    try:
        os.rmdir(os.path.join(d, opt_dir))
    except OSError:
        pass
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        if is_ckpt_file(n):
            try:
                os.unlink(os.path.join(d, n))
            except OSError:
                pass
    try:
        os.rmdir(d)
    except OSError:
        pass


def remove_stale(d, is_ckpt_file, opt_dir):
    """The DIR.tmp-* of killed saves (six or more characters: the C
    writer's too) that no live writer holds."""
    pre = d + ".tmp-"
    for t in glob.glob(glob.escape(pre) + "*"):
        if len(t) - len(pre) < 6 or os.path.islink(t) or not os.path.isdir(t):
            continue
        try:
            fd = os.open(t, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            remove_ckpt_dir(t, is_ckpt_file, opt_dir)
        except OSError:
            pass  # a live writer's
        finally:
            os.close(fd)


_libc = None
AT_FDCWD, RENAME_EXCHANGE = -100, 2


def exchange(a, b):
    """renameat2(a, b, RENAME_EXCHANGE): a and b swap names in one step."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    f = _libc.renameat2
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if f(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"cannot replace the old checkpoint {b}: {os.strerror(e)}")


def put_in_place(tmp, d):
    """tmp (complete, synced) becomes d; returns the name now holding the
    old checkpoint (tmp after an exchange) or None."""
    try:
        os.rename(tmp, d)  # d absent (or an empty directory)
        old = None
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        exchange(tmp, d)
        old = tmp
    test_point("renamed")
    fsync_path(os.path.dirname(d))
    return old
