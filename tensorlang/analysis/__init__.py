"""Names, shapes, types and diagnostics over the AST. Knows nothing of TVM or the LSP."""
from tensorlang.analysis.check import check_module  # noqa: F401
