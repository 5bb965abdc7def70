"""The vector-width innermost tile (space/vector_tile.py): under the preference every multi-level tile of a
stage's last spatial loop has an innermost factor the vector units can fill, where the extent allows one;
a written split wins over it; other loops are left to the model."""
import random

import pytest

from tensorlang import api
from tensorlang.parser import parse
from tensorlang.space import constraints as C
from tensorlang.space.space import TILE, Space
from tensorlang.space.vector_tile import vector_innermost, vector_lanes

from conftest import ROOT

MATMUL = ROOT / "examples" / "matmul.tsched"


@pytest.fixture(scope="module")
def matmul():
    doc = api.load(MATMUL)
    return Space(doc.model.ops["matmul"], doc.primfunc("matmul"), doc.model.targets["cpu"])


def walk(space, prefer, seed, cons=None):
    """Random decoding through ConstrainedTokens; -> (point, {tile decision's subject: (decision point, factors)})."""
    dec = C.ConstrainedTokens(space, cons, prefer=prefer)
    rng = random.Random(seed)
    try:
        while not dec.done:
            dec.push(rng.choice(sorted(dec.allowed())))
        point = dec.finish()
    finally:
        dec.close()
    tiles = {}

    def choose(p, prefix):
        value = point.decisions[len(prefix)]
        if p.kind == TILE:
            tiles[p.subject] = (p, value)
        return value
    space.replay(point.sketch, choose, convert=False)
    return point, tiles


def test_the_last_spatial_loop_gets_a_vector_width_multiple(matmul):
    lanes = vector_lanes(matmul)
    assert lanes >= 4  # every CPU the project runs on has 128-bit vectors at least
    plain = [walk(matmul, None, s)[1] for s in range(12)]
    preferred = [walk(matmul, vector_innermost, s)[1] for s in range(12)]

    def last_spatial(tiles):
        return [f for p, f in tiles.values() if p.role == "S"
                and p.axis == max(i for i, a in enumerate(p.axes) if a[2] == "S")]
    assert any(f[-1] % lanes for t in plain for f in last_spatial(t))  # the space offers other innermost factors
    assert all(f[-1] % lanes == 0 for t in preferred for f in last_spatial(t))
    assert all(last_spatial(t) for t in preferred)  # (the check above saw tiles)
    # the other loops keep their whole domain: the first spatial loop still takes innermost factors of every kind
    firsts = {f[-1] for t in preferred for p, f in t.values() if p.role == "S" and p.axis == 0}
    assert len(firsts) > 1


def test_a_written_split_wins_over_the_preference(matmul):
    module, diags = parse("schedule matmul on cpu {\n"
                          "    annotate(C, \"meta_schedule.tiling_structure\", \"SSRSRS\")\n"
                          "    j0, j1, j2, j3 = split(C.j, [1, 1, 512, 1])\n}\n")
    assert not diags
    cons = C.constraints(matmul, tuple(module.schedules[0].stmts))
    assert cons.outside is None
    point, tiles = walk(matmul, vector_innermost, 0, cons)
    assert [f for p, f in tiles.values() if p.subject.startswith("j")] == [(1, 1, 512, 1)]


def test_the_shipped_model_leaves_it_off_unless_its_config_says_so(tmp_path):
    import json
    import shutil

    from tensorlang.lm import model as M
    assert not M.generation_vector_tile(ROOT / "tensorlang" / "lm" / "checkpoints" / "default")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ROOT / "tensorlang" / "lm" / "checkpoints" / "default", ckpt)
    cfg = json.loads((ckpt / M.GENERATION_CONFIG).read_text())
    (ckpt / M.GENERATION_CONFIG).write_text(json.dumps({**cfg, M.VECTOR_INNERMOST: True}))
    assert M.generation_vector_tile(ckpt)
