"""Worker processes: a pool of builders, and a persistent, self-healing pool of kernel runners.

Kernel runners are processes of our own (`multiprocessing`, one pipe each), one per *slot*
(the harness uses a slot for TVM kernels and one for Python kernels, so PyTorch's thread pool never
lives next to TVM's). A request that does not answer within its timeout gets its runner killed
(`timeout`); a runner that dies while serving a request (a segfault, an abort) is a `crash`. Either
way the slot gets a fresh runner on its next request, and kernels the old one had loaded are loaded
again there -- one bad candidate never takes the run down.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from tensorlang.bench import worker as W

START_METHOD = "spawn"  # a runner of Python (PyTorch) kernels: a fresh interpreter
STARTUP_TIMEOUT_S = 180.0


def tvm_context():
    """Build workers and TVM-kernel runners are forked from a forkserver that has imported TVM
    (bench/tvm_preload.py): a fork from a clean, single-threaded process, never from the caller (whose
    threads a fork could catch holding a lock), and TVM imported once instead of once per worker."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tensorlang.bench.tvm_preload"])
    return ctx


def build_pool(jobs: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=tvm_context(), initializer=W.build_init)


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Shut a build pool down now, killing workers that are still busy (a build that hangs)."""
    procs = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(5)


class WorkerDied(Exception):
    """The runner died or was killed while serving a request."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status  # "crash" | "timeout"
        self.message = message


class RequestError(Exception):
    """The runner answered with a Python error (the runner itself is fine)."""


def signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "unknown"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


@dataclass
class _Runner:
    process: object
    conn: object
    log_path: str
    info: dict
    loaded: set = field(default_factory=set)


class KernelPool:
    """Slots of runner processes. `request(slot, key, msg, timeout_s)` sends one request to the slot's
    runner, first (re)loading kernel `key` there if that runner has not loaded it."""

    def __init__(self, log_dir: str, threads: int | None = None, preload: dict | None = None):
        self.log_dir = log_dir
        self.threads = threads
        self.preload = {"tvm": ("tvm",)} if preload is None else preload  # slot -> modules to import first
        self.runners: dict[str, _Runner] = {}
        self.pending: dict[str, tuple] = {}  # slot -> (process, conn, log) started, not yet ready
        self.specs: dict[str, dict] = {}  # key -> load spec (for re-loading in a fresh runner)
        self.started = 0  # runners started so far (replacements included)

    # ----------------------------------------------------------- lifecycle
    def prestart(self, slot: str) -> None:
        """Start the slot's runner now (it imports TVM while the caller does other work)."""
        if slot not in self.runners and slot not in self.pending:
            self.pending[slot] = self._spawn(slot)

    def _spawn(self, slot: str):
        self.started += 1
        log = os.path.join(self.log_dir, f"runner-{slot}-{self.started}.log")
        ctx = tvm_context() if "tvm" in self.preload.get(slot, ()) else mp.get_context(START_METHOD)
        parent, child = ctx.Pipe(duplex=True)
        p = ctx.Process(target=W.runner_main, args=(child, self.threads, log, tuple(self.preload.get(slot, ()))),
                        daemon=True, name=f"tensorlang-runner-{slot}")
        p.start()
        child.close()
        return p, parent, log

    def runner(self, slot: str) -> _Runner:
        r = self.runners.get(slot)
        if r is not None:
            return r
        p, conn, log = self.pending.pop(slot, None) or self._spawn(slot)
        if not conn.poll(STARTUP_TIMEOUT_S):
            p.kill()
            p.join()
            raise RuntimeError(f"a kernel runner did not start in {STARTUP_TIMEOUT_S:.0f} s")
        try:
            kind, info = conn.recv()
        except EOFError:
            p.join()
            raise RuntimeError(f"a kernel runner died while starting ({signal_name(p.exitcode)}): "
                               f"{_tail(log)}") from None
        r = _Runner(p, conn, log, info)
        self.runners[slot] = r
        return r

    def _discard(self, slot: str, kill: bool) -> int | None:
        r = self.runners.pop(slot)
        if kill and r.process.is_alive():
            r.process.kill()
        r.process.join(10)
        r.conn.close()
        return r.process.exitcode

    def close(self) -> None:
        for slot in list(self.runners):
            r = self.runners[slot]
            try:
                r.conn.close()  # the runner sees EOF and exits
            except OSError:
                pass
            r.process.join(2)
            if r.process.is_alive():
                r.process.kill()
                r.process.join()
            del self.runners[slot]
        for slot, (p, conn, _) in list(self.pending.items()):
            conn.close()
            p.kill()
            p.join()
        self.pending.clear()

    # ------------------------------------------------------------- requests
    def _call(self, slot: str, msg: tuple, timeout_s: float):
        r = self.runner(slot)
        try:
            r.conn.send(msg)
        except (BrokenPipeError, OSError):
            pass  # it died already: the poll below says so
        t0 = time.monotonic()
        if not r.conn.poll(timeout_s):
            self._discard(slot, kill=True)
            raise WorkerDied("timeout", f"no answer within {timeout_s:g} s; the runner was killed")
        try:
            status, value = r.conn.recv()
        except (EOFError, OSError):
            code = self._discard(slot, kill=False)
            detail = _tail(r.log_path)
            raise WorkerDied("crash", f"the runner died ({signal_name(code)}) after "
                                      f"{time.monotonic() - t0:.2f} s" + (f": {detail}" if detail else "")) from None
        if status != "ok":
            raise RequestError(value)
        return value

    def load(self, slot: str, key: str, spec: dict, timeout_s: float):
        """Load kernel `key` in the slot's runner and run it once; its outputs if spec asks for them."""
        self.specs[key] = dict(spec, return_outputs=False, run=False)
        value = self._call(slot, ("load", key, spec), timeout_s)
        self.runners[slot].loaded.add(key)
        return value

    def request(self, slot: str, key: str, msg: tuple, timeout_s: float):
        r = self.runner(slot)
        if key not in r.loaded:
            self._call(slot, ("load", key, self.specs[key]), timeout_s)
            self.runners[slot].loaded.add(key)
        return self._call(slot, msg, timeout_s)

    def unload(self, slot: str, key: str, timeout_s: float = 10.0) -> None:
        self.specs.pop(key, None)
        r = self.runners.get(slot)
        if r is not None and key in r.loaded:
            r.loaded.discard(key)
            self._call(slot, ("unload", key), timeout_s)

    def info(self, slot: str, timeout_s: float = 10.0) -> dict:
        return self._call(slot, ("info",), timeout_s)


def _tail(path: str, lines: int = 3) -> str:
    """The first informative lines of a runner's log (TVM prints a banner and a backtrace on a crash)."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-20000:]
    except OSError:
        return ""
    picked = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("File ")]
    return " | ".join(picked[:lines])
