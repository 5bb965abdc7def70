"""tensorlang/data/synthetic.py: the wide matmuls are what data/workloads-variants/wide-matmuls holds, every one
parses and checks, none is a held-out task or a relative of the held-out extent, and each kind of factorization
is there."""
import json
from pathlib import Path

from tensorlang import api
from tensorlang.data import split, synthetic
from tensorlang.data.collect import op_hash

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "data" / "workloads-variants" / "wide-matmuls"


def test_the_committed_files_are_what_the_generator_writes(tmp_path):
    files = synthetic.write(tmp_path)
    assert sorted(f.name for f in files) == sorted(f.name for f in COMMITTED.glob("*.tsched"))
    for f in files:
        assert f.read_text() == (COMMITTED / f.name).read_text()
    manifest = json.loads((COMMITTED / "manifest.json").read_text())
    assert manifest["model"] == "wide-matmuls" and manifest["tasks"] == [f.name for f in files]


def test_every_wide_matmul_checks_and_none_is_held_out():
    heldout = split.heldout_keys(ROOT / "data" / "split.json")
    for f in sorted(COMMITTED.glob("*.tsched")):
        doc = api.load(f)
        assert not doc.diagnostics, (f, doc.diagnostics)
        (op,) = doc.model.ops.values()
        assert op_hash(op) not in heldout
        assert op.flops <= 2.5 * synthetic.MAX_FLOPS


def test_the_extents_are_wide_of_three_factorizations_and_no_relative_of_11008():
    extents = synthetic.wide_extents()
    assert len(set(extents)) == len(extents) == 30
    assert all(2000 <= n <= 60000 and synthetic._odd_part(n) != 43 for n in extents)
    smooth = [n for n in extents if all(p in (2, 3, 5, 7) for p in _factors(n))]
    two_odd_primes = [n for n in extents if n % 2 and len(_factors(n)) == 2]
    odd = {n: synthetic._odd_part(n) for n in extents}
    power_of_two_times_prime = [n for n in extents if odd[n] > 7 and _factors(odd[n]) == [odd[n]]]
    assert len(smooth) == len(two_odd_primes) == len(power_of_two_times_prime) == 10
    assert sum(n > 10000 for n in extents) >= 15


def _factors(n):
    out, d = [], 2
    while d * d <= n:
        while n % d == 0:
            out.append(d)
            n //= d
        d += 1
    return out + ([n] if n > 1 else [])
