"""What the TVM workers' forkserver imports once, so that each build worker and TVM-kernel runner forked
from it starts with TVM loaded (1.3-1.5 s of imports each, on 2 cores four processes importing at once)
instead of importing it again. PyTorch is kept out first, as in every TVM worker (worker.keep_torch_out)."""
from tensorlang.bench.worker import keep_torch_out

keep_torch_out()

import numpy  # noqa: E402,F401
import tvm  # noqa: E402,F401

import tensorlang.lower.build  # noqa: E402,F401
import tensorlang.lower.schedule  # noqa: E402,F401
import tensorlang.lower.te_build  # noqa: E402,F401
