"""The measurement harness: `tensorlang bench`, and `measure_candidates` for whoever needs figures.

- harness.py: Candidate, Result, PythonKernel, Harness, measure_candidates (build in parallel worker
  processes, check against the NumPy reference, time one at a time in interleaved rounds);
- pool.py: the build pool and the self-healing pool of kernel-runner processes;
- worker.py: what runs in those processes;
- lock.py: the machine-wide measurement lock (`measure_lock`);
- command.py: `tensorlang bench` (policies -> candidates -> table and JSON);
- machine.py: the description of this machine that every report carries.

Names are imported on first use, so that `tensorlang bench`'s argument parser costs the CLI nothing.
Code that starts the harness from a script needs the `if __name__ == "__main__":` guard: its worker
processes are spawned, and a spawned process imports the main script again.
"""
_EXPORTS = {
    "Candidate": "harness", "Result": "harness", "PythonKernel": "harness", "Library": "harness", "Harness": "harness",
    "measure_candidates": "harness", "STATUSES": "harness", "measure_lock": "lock",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f"tensorlang.bench.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'tensorlang.bench' has no attribute {name!r}")
