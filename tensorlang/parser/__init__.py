"""Text -> AST (`parse`) and AST -> canonical text (`format_module`)."""
from tensorlang.parser.parse import parse, parse_file  # noqa: F401
from tensorlang.parser.printer import format_module  # noqa: F401
