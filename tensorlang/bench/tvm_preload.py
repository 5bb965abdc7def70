"""What the TVM workers' forkserver imports once, so that each build worker and TVM-kernel runner forked
from it starts with TVM loaded (1.3-1.5 s of imports each, on 2 cores four processes importing at once)
instead of importing it again: a build worker's own imports (worker.build_init, PyTorch kept out first)."""
from tensorlang.bench.worker import build_init

build_init()
