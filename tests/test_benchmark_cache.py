"""benchmarks/tlm.py's schedule cache is per host: another machine's schedules are never re-timed as this one's."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import tlm as bench  # noqa: E402

from tensorlang.machine import host  # noqa: E402


def test_the_default_cache_is_named_for_this_host():
    cpu = host()
    assert bench.cache_path().name == f"tlm_schedules.{cpu.name}-{cpu.id}.json"


def test_a_cache_of_another_machine_is_refused_and_left_as_it_was(tmp_path):
    other = tmp_path / "other.json"
    text = json.dumps({"host|": "not-this-machine", "a.tsched:a|tlm": {"schedule_text": "x"}})
    other.write_text(text)
    with pytest.raises(SystemExit, match="not-this-machine"):
        bench.Cache(other)
    assert other.read_text() == text


def test_a_new_cache_records_this_host_and_reopens(tmp_path):
    path = tmp_path / "mine.json"
    cache = bench.Cache(path)
    cache.put("a.tsched:a|roller", {"schedule_text": "y"})
    assert json.loads(path.read_text())["host|"] == host().id
    assert bench.Cache(path).get("a.tsched:a|roller") == {"schedule_text": "y"}
