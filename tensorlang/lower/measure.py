"""Run a compiled kernel in this process and time it with TVM's time_evaluator."""
from __future__ import annotations

import numpy as np

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.model import OpModel


def time_function(lib, op: OpModel, inputs: dict[str, np.ndarray], repeat: int = 5, min_repeat_ms: int = 50,
                  device=None) -> tuple[dict[str, np.ndarray], float]:
    """(outputs, median seconds per call). Outputs come from one plain call before timing."""
    import tvm
    dev = device or tvm.cpu(0)
    args = [tvm.runtime.tensor(inputs[t.name], dev) for t in op.inputs]
    outs = [tvm.runtime.tensor(np.zeros(t.shape, dtype=D.numpy_dtype(t.dtype)), dev) for t in op.outputs]
    lib["main"](*args, *outs)
    results = {t.name: o.numpy() for t, o in zip(op.outputs, outs)}
    timer = lib.mod.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
    costs = timer(*args, *outs).results
    return results, float(np.median(costs))
