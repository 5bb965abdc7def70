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


def test_the_cold_cli_figure_is_refreshed_in_place_from_interleaved_runs(tmp_path, monkeypatch):
    """--cold-cli-only: the policies alternate (the host's load falls on both), the median of each is kept,
    and the rest of the report -- another run's figures, with that run's command -- is left as it was."""
    order, seconds = [], {"tlm": iter([3.0, 9.0, 3.2]), "roller": iter([2.9, 2.8, 8.0])}

    def timed_lowering(file, op, policy):
        order.append(policy)
        return {"policy": policy, "task": f"{file}:{op}", "seconds": next(seconds[policy]), "rc": 0}

    monkeypatch.setattr(bench, "cold_cli", timed_lowering)
    out = tmp_path / "tlm.json"
    out.write_text(json.dumps({"command": "the full run", "sets": {"heldout": {"tasks": 22}},
                               "cold_cli": [{"policy": "tlm", "seconds": 4.5}]}))
    report = bench.refresh_cold_cli(out, 3, ["--cold-cli-only", "3"])
    assert order == ["tlm", "roller"] * 3
    assert [(c["policy"], c["seconds"], c["runs"]) for c in report["cold_cli"]] == [
        ("tlm", 3.2, [3.0, 9.0, 3.2]), ("roller", 2.9, [2.9, 2.8, 8.0])]
    again = json.loads(out.read_text())
    assert again == report and again["command"] == "the full run" and again["sets"] == {"heldout": {"tasks": 22}}
    assert again["cold_cli_measured"]["command"].endswith("benchmarks/tlm.py --cold-cli-only 3")
    assert "cold CLI lower --emit so (tlm, matmul): 3.2 s (rc 0, runs [3.0, 9.0, 3.2])" in bench.cold_cli_lines(report)
