"""The machine-wide measurement lock.

Whoever times kernels on this machine -- `tensorlang bench`, `benchmarks/policies.py`, a background
data collector -- holds this lock while timing, so that two timers never run at once and skew each
other. It is an exclusive `flock` on a file: `/tmp/tensorlang-measure.lock`, or the path in the
environment variable TENSORLANG_MEASURE_LOCK. The kernel releases it when its holder exits, however
it exits (a crashed holder never leaves the machine locked).

    with measure_lock() as held:
        ...                      # time kernels
    held.wait_s                  # how long it waited for another timer

Threads of one process take turns too, and a thread that holds it may take it again (nested
`measure_lock()` blocks do not deadlock).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from dataclasses import dataclass

DEFAULT_PATH = "/tmp/tensorlang-measure.lock"
ENV = "TENSORLANG_MEASURE_LOCK"

_guard = threading.Lock()
_threads: dict[str, threading.RLock] = {}  # path -> the lock the threads of this process take first
_depth: dict[str, int] = {}  # path -> nesting depth of the thread that holds it


def lock_path() -> str:
    return os.environ.get(ENV) or DEFAULT_PATH


@dataclass
class Held:
    path: str
    wait_s: float = 0.0  # time spent waiting for another holder
    acquired_at: float = 0.0  # time.time() when acquired


class LockTimeout(TimeoutError):
    pass


@contextlib.contextmanager
def measure_lock(path: str | None = None, timeout_s: float | None = None, poll_s: float = 0.05):
    """Hold the measurement lock for the duration of the block. `timeout_s`: give up after this long
    (LockTimeout); None waits as long as it takes."""
    path = os.path.abspath(path or lock_path())
    with _guard:
        rlock = _threads.setdefault(path, threading.RLock())
    start = time.monotonic()
    if not rlock.acquire(timeout=-1 if timeout_s is None else timeout_s):
        raise LockTimeout(f"the measurement lock {path} is held by another thread (waited {timeout_s:.0f} s)")
    try:
        if _depth.get(path, 0):  # this thread holds it already
            _depth[path] += 1
            try:
                yield Held(path, 0.0, time.time())
            finally:
                _depth[path] -= 1
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            if timeout_s is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() - start >= timeout_s:
                            raise LockTimeout(f"the measurement lock {path} is held by another process "
                                              f"(waited {timeout_s:.0f} s)") from None
                        time.sleep(poll_s)
            held = Held(path, time.monotonic() - start, time.time())
            try:  # who holds it, for people looking at the file
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            except OSError:
                pass
            _depth[path] = 1
            try:
                yield held
            finally:
                _depth[path] = 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        rlock.release()
