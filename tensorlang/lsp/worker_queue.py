"""The server's side of the worker processes: a priority queue of jobs, one job at a time per worker.

    w = Worker("analysis")
    result = await w.call("schedule_state", op_model, sched, line, priority=INTERACTIVE)

Jobs with the same `key` share one run. A job nobody waits for any more (its request was cancelled,
or a newer version of the document superseded it) is dropped before it starts. A worker that dies
(a TVM crash) fails its job and is restarted for the next one; `kill()` stops a running job
(cancelled measurements).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("tensorlang.lsp")

INTERACTIVE, GENERATE, LEGALITY, BACKGROUND = 0, 1, 2, 3


class WorkerError(Exception):
    pass


@dataclass(order=True)
class Job:
    priority: int
    seq: int
    name: str = field(compare=False)
    args: tuple = field(compare=False)
    future: asyncio.Future = field(compare=False)
    key: Any = field(compare=False, default=None)
    waiters: int = field(compare=False, default=0)
    keep: bool = field(compare=False, default=False)  # run even if nobody waits
    stale: Callable[[], bool] | None = field(compare=False, default=None)
    on_progress: Callable | None = field(compare=False, default=None)


class Worker:
    def __init__(self, name: str):
        self.name = name
        self._queue: asyncio.PriorityQueue | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task | None = None
        self._pending: dict[Any, Job] = {}
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self.running: Job | None = None
        self.started = 0  # processes started
        self.done = 0  # jobs finished

    # ----------------------------------------------------------- public
    def submit(self, name: str, *args, priority: int = INTERACTIVE, key=None, keep: bool = False,
               stale: Callable[[], bool] | None = None, on_progress: Callable | None = None,
               on_result: Callable | None = None) -> Job:
        if key is not None and key in self._pending and not self._pending[key].future.done():
            job = self._pending[key]
            job.keep = job.keep or keep
            self._add_result_callback(job, on_result)
            return job
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "exception not retrieved"
        job = Job(priority, next(self._seq), name, args, fut, key, keep=keep, stale=stale, on_progress=on_progress)
        self._add_result_callback(job, on_result)
        if key is not None:
            self._pending[key] = job
        if self._queue is None:
            self._queue = asyncio.PriorityQueue()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._dispatch())
        self._queue.put_nowait(job)
        return job

    @staticmethod
    def _add_result_callback(job: Job, on_result: Callable | None):
        if on_result is None:
            return

        def done(f):
            if not f.cancelled() and f.exception() is None:
                try:
                    on_result(f.result())
                except Exception:
                    log.exception("result callback failed")
        job.future.add_done_callback(done)

    async def call(self, name: str, *args, priority: int = INTERACTIVE, key=None, timeout: float | None = None,
                   stale: Callable[[], bool] | None = None, on_progress: Callable | None = None,
                   on_result: Callable | None = None):
        """Run a job and wait for its result (WorkerError on failure, TimeoutError after `timeout`).
        `on_result` is called with the result even if every caller has stopped waiting by then.
        Cancelling the caller leaves the job to others waiting for it, or drops it if none are."""
        job = self.submit(name, *args, priority=priority, key=key, stale=stale, on_progress=on_progress,
                          on_result=on_result)
        job.waiters += 1
        try:
            if timeout is None:
                return await asyncio.shield(job.future)
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        finally:
            job.waiters -= 1

    def kill(self):
        """Stop the worker process (and so the job it runs); the next job starts a new one."""
        if self._proc is not None and self._proc.returncode is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass

    async def close(self):
        if self._task is not None:
            self._task.cancel()
        proc = self._proc
        self._proc = None
        if proc is not None and proc.returncode is None:
            try:
                proc.stdin.close()
                await asyncio.wait_for(proc.wait(), 2)
            except Exception:
                self._kill_proc(proc)

    def close_now(self):
        if self._proc is not None:
            self._kill_proc(self._proc)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    # ---------------------------------------------------------- private
    @staticmethod
    def _kill_proc(proc):
        try:
            proc.kill()
        except (ProcessLookupError, AttributeError):
            pass

    async def _ensure(self):
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tensorlang.lsp.tvm_worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=None, env=env, limit=1 << 26)
        self.started += 1
        log.info("worker %s started (pid %s)", self.name, self._proc.pid)
        return self._proc

    async def _dispatch(self):
        while True:
            job: Job = await self._queue.get()
            if job.future.done():
                self._forget(job)
                continue
            if (not job.keep and job.waiters == 0) or (job.stale is not None and job.stale()):
                job.future.cancel()
                self._forget(job)
                continue
            self.running = job
            try:
                result = await self._execute(job)
                if not job.future.done():
                    job.future.set_result(result)
            except asyncio.CancelledError:
                if not job.future.done():
                    job.future.cancel()
                raise
            except Exception as e:
                if not job.future.done():
                    job.future.set_exception(e if isinstance(e, WorkerError) else WorkerError(f"{type(e).__name__}: {e}"))
            finally:
                self.running = None
                self.done += 1
                self._forget(job)

    def _forget(self, job: Job):
        if job.key is not None and self._pending.get(job.key) is job:
            del self._pending[job.key]

    async def _execute(self, job: Job):
        proc = await self._ensure()
        job_id = next(self._ids)
        data = pickle.dumps((job_id, job.name, job.args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            proc.stdin.write(len(data).to_bytes(8, "little") + data)
            await proc.stdin.drain()
            while True:
                header = await proc.stdout.readexactly(8)
                body = await proc.stdout.readexactly(int.from_bytes(header, "little"))
                rid, status, value = pickle.loads(body)
                if rid != job_id:
                    continue
                if status == "progress":
                    if job.on_progress is not None:
                        try:
                            job.on_progress(*value)
                        except Exception:
                            log.exception("progress callback failed")
                    continue
                if status == "ok":
                    return value
                raise WorkerError(value)
        except (asyncio.IncompleteReadError, BrokenPipeError, ConnectionResetError) as e:
            self._proc = None
            raise WorkerError(f"the {self.name} worker stopped ({type(e).__name__})") from None
