"""Scale-out: `tensorlang collect --rpc` times kernels on TVM RPC servers found through a tracker."""
import subprocess
import sys
import time

import pytest

from tensorlang.data import dataset
from test_collect import rowsum_tasks



@pytest.fixture
def tracker_with_two_servers():
    pytest.importorskip("tornado")
    from tvm import rpc
    from tvm.rpc.tracker import Tracker
    tracker = Tracker(host="127.0.0.1", port=19190, port_end=19390, silent=True)
    servers = [rpc.Server(host="127.0.0.1", port=19400, port_end=19600, tracker_addr=("127.0.0.1", tracker.port),
                          key="tl-test", silent=True) for _ in range(2)]
    summary = None
    for _ in range(50):  # the servers register with the tracker asynchronously
        summary = rpc.connect_tracker("127.0.0.1", tracker.port).summary()
        if summary["queue_info"].get("tl-test", {}).get("free") == 2:
            break
        time.sleep(0.2)
    assert summary["queue_info"]["tl-test"]["free"] == 2, summary
    yield tracker, servers
    for s in servers:
        s.terminate()
    tracker.terminate()


def test_collect_over_rpc_uses_both_servers(tmp_path, tracker_with_two_servers):
    tracker, servers = tracker_with_two_servers
    tasks, env = rowsum_tasks(tmp_path)
    out = tmp_path / "measured"
    cmd = [sys.executable, "-m", "tensorlang", "collect", str(tasks), "--target", "cpu", "--trials", "6",
           "--batch", "6", "--repeat", "2", "-o", str(out), "--rpc", f"127.0.0.1:{tracker.port}:tl-test",
           "--rpc-sessions", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    records = list(dataset.read(out))
    assert len(records) == 6
    assert {x["status"] for x in records} == {"ok"}, [x["message"] for x in records]
    assert {x["machine"] for x in records} == {"rpc:tl-test"}
    assert all(x["median_s"] > 0 for x in records)
    # the tracker's answer names the server: both took part
    assert {x["server"] for x in records} == {f"127.0.0.1:{s.port}" for s in servers}


def test_a_kernel_that_crashes_a_server_session_is_recorded_and_the_next_runs(tmp_path, tracker_with_two_servers):
    """A real segfault on the server ends that session only (the server forks one per session): the
    candidate is recorded as a crash, a fresh session is taken, and the next candidate is measured."""
    import tvm

    from tensorlang.bench import Candidate, Harness, Library
    from tensorlang.bench.rpc import RPCConfig
    from test_bench import COPY, bad_kernels
    tracker, _ = tracker_with_two_servers
    segfault, _ = bad_kernels()
    lib = str(tmp_path / "segfault.so")
    tvm.compile(segfault, target=tvm.target.Target({"kind": "llvm"})).export_library(lib)
    cands = [Candidate("segfault", COPY, "cpu", Library(lib)), Candidate("after", COPY, "cpu", None)]
    with Harness(jobs=1, rpc=RPCConfig("127.0.0.1", tracker.port, "tl-test", sessions=1)) as h:
        results = h.measure(cands, repeat=2, min_repeat_ms=5, timeout_s=30, lock_path=str(tmp_path / "lock"))
    assert [r.status for r in results] == ["crash", "ok"], [(r.status, r.message) for r in results]
    assert results[1].times_s and results[1].worker["server"].startswith("127.0.0.1:")


def test_rpc_address_is_checked():
    from tensorlang.bench.rpc import RPCConfig
    assert RPCConfig.parse("10.0.0.5:9190:cpu", 3) == RPCConfig("10.0.0.5", 9190, "cpu", 3)
    with pytest.raises(ValueError, match="HOST:PORT:KEY"):
        RPCConfig.parse("10.0.0.5:cpu")
