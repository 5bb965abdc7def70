"""Measuring on other machines through TVM's RPC tracker and servers (the route of MetaSchedule's RPCRunner).

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190
    python -m tvm.exec.rpc_server --tracker HOST:9190 --key cpu        # on each measuring machine
    tensorlang collect data/workloads --target llvm --rpc HOST:9190:cpu --rpc-sessions 2

Candidates are still built here (the harness's build pool); each exported library is uploaded to a
server the tracker hands out, loaded there, run once on the task's inputs (outputs come back and are
checked against the NumPy reference here), then timed there with `time_evaluator`. One session per
server runs at a time, so `sessions` servers measure in parallel, each timing one kernel at a time.

Unlike MetaSchedule's RPCRunner we also bring outputs back (a wrong kernel is recorded as wrong, not
as fast) and remember which server measured each candidate: the tracker's answer names the server's
address, which the stock `TrackerSession.request` discards, so `_AddressedTracker` keeps it.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RPCConfig:
    host: str
    port: int
    key: str
    sessions: int = 1  # servers used in parallel
    session_timeout_s: float = 600.0  # the server kills a session that lasts longer (a hung kernel)

    @staticmethod
    def parse(text: str, sessions: int = 1) -> "RPCConfig":
        """'HOST:PORT:KEY' -> RPCConfig."""
        parts = text.rsplit(":", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2]:
            raise ValueError(f"--rpc wants HOST:PORT:KEY (the tracker's address and the servers' key), got {text!r}")
        return RPCConfig(parts[0], int(parts[1]), parts[2], sessions)


@dataclass
class RemoteJob:
    """One built kernel to measure remotely."""
    path: str  # the exported shared library
    inputs: dict  # name -> numpy array, in argument order
    outputs: list  # (name, shape, dtype), in argument order
    status: str = "ok"  # ok | crash | error
    message: str = ""
    outputs_got: dict = field(default_factory=dict)
    times_s: list = field(default_factory=list)
    server: str = ""  # "host:port" of the server that measured it
    load_s: float | None = None


def _addressed_tracker(host: str, port: int):
    from tvm.rpc import base
    from tvm.rpc.client import TrackerSession, connect

    class _AddressedTracker(TrackerSession):
        def request_addressed(self, key: str, session_timeout: float):
            """(session, 'host:port'): TrackerSession.request that also says which server it got."""
            if self._sock is None:
                self._connect()
            base.sendjson(self._sock, [base.TrackerCode.REQUEST, key, "", 1])
            value = base.recvjson(self._sock)
            if value[0] != base.TrackerCode.SUCCESS:
                raise RuntimeError(f"the tracker refused the request for key {key!r}: {value}")
            url, port, matchkey = value[1]
            return connect(url, port, matchkey, session_timeout), f"{url}:{port}"

    return _AddressedTracker((host, port))


class RPCRunner:
    def __init__(self, config: RPCConfig):
        self.config = config

    def servers(self) -> dict:
        """The tracker's summary: {'queue_info': {key: {'free', 'pending'}}, 'server_info': [...]}."""
        from tvm import rpc
        return rpc.connect_tracker(self.config.host, self.config.port).summary()

    def run(self, jobs: list[RemoteJob], repeat: int, min_repeat_ms: float, timeout_s: float,
            say=lambda msg: None) -> list[RemoteJob]:
        """Measure every job; `sessions` threads, each holding one server, take jobs from a queue."""
        todo: queue.Queue = queue.Queue()
        for j in jobs:
            todo.put(j)
        errors: list[str] = []

        def session_loop():
            try:
                tracker = _addressed_tracker(self.config.host, self.config.port)
                remote, server = tracker.request_addressed(self.config.key, self.config.session_timeout_s)
            except Exception as e:  # no server: the jobs stay queued for the other threads
                errors.append(f"{type(e).__name__}: {e}")
                return
            while True:
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                job.server = server
                try:
                    self._measure(remote, job, repeat, min_repeat_ms)
                except Exception as e:  # the session is gone (a crash on the server) or the call failed
                    job.status, job.message = "crash", f"on {server}: {type(e).__name__}: {str(e)[:200]}"
                    say(f"{os.path.basename(job.path)}: {job.message}")
                    try:  # a fresh session for the next job
                        remote, server = tracker.request_addressed(self.config.key, self.config.session_timeout_s)
                    except Exception as e2:
                        errors.append(f"{type(e2).__name__}: {e2}")
                        return

        threads = [threading.Thread(target=session_loop, daemon=True) for _ in range(max(1, self.config.sessions))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s * max(1, len(jobs))
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        while not todo.empty():  # every thread gave up: say why on each job left
            job = todo.get_nowait()
            job.status = "error"
            job.message = "no RPC server could be reached: " + (errors[0] if errors else "timed out")
        return jobs

    @staticmethod
    def _measure(remote, job: RemoteJob, repeat: int, min_repeat_ms: float) -> None:
        import numpy as np
        import tvm
        dev = remote.cpu(0)
        t0 = time.perf_counter()
        remote.upload(job.path)
        name = os.path.basename(job.path)
        lib = remote.load_module(name)
        job.load_s = time.perf_counter() - t0
        args = [tvm.runtime.tensor(np.asarray(a, order="C"), dev) for a in job.inputs.values()]
        outs = [tvm.runtime.tensor(np.full(shape, np.nan if np.dtype(dtype).kind == "f" else 0x5A, dtype=dtype), dev)
                for _, shape, dtype in job.outputs]
        lib["main"](*args, *outs)
        job.outputs_got = {n: o.numpy() for (n, _, _), o in zip(job.outputs, outs)}
        timer = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=int(max(1, min_repeat_ms)))
        job.times_s = [float(t) for t in timer(*args, *outs).results]
        try:
            remote.remove(name)
        except Exception:
            pass
