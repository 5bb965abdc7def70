import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.tsched"))
TENSORLANG = [sys.executable, "-m", "tensorlang"]


@pytest.fixture(params=EXAMPLES, ids=lambda p: p.stem)
def example(request) -> Path:
    return request.param
