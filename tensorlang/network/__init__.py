"""Whole models: compile a network with generated (or edited) .tsched schedules, profile it, benchmark it.

- compile.py: `tensorlang compile-model` -- the model's Relax module (the extraction of `tensorlang extract`),
  one schedule per unique subgraph, one Relax VM executable, the schedules written next to it;
- profile.py: `tensorlang profile-model` -- the Relax VM profiler's time per subgraph, with the file to edit;
- bench.py: `tensorlang bench-model` -- executables of several policies against PyTorch, end to end.

Nothing here imports TVM or torch at module load: the CLI's start-up stays fast.
"""
