"""The measurement harness: `tensorlang bench`, and `measure_candidates` for whoever needs figures.

- harness.py: Candidate, Result, PythonKernel, Harness, measure_candidates (build in parallel worker
  processes, check against the NumPy reference, time one at a time in interleaved rounds);
- pool.py: the build pool and the self-healing pool of kernel-runner processes;
- lock.py: the machine-wide measurement lock;
- command.py: `tensorlang bench` (policies -> candidates -> table and JSON);
- machine.py: the description of this machine that every report carries.
"""
from tensorlang.bench.harness import (STATUSES, Candidate, Harness, PythonKernel, Result,  # noqa: F401
                                      measure_candidates)
from tensorlang.bench.lock import measure_lock  # noqa: F401
