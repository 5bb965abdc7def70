"""Workload extraction (tensorlang.data): models -> Relax -> MetaSchedule tasks -> .tsched operators.

A small config of each of the six models is extracted in-process. Every translation of BERT's is
compared numerically with its original PrimFunc (compiled with tvm.compile), a sample of 3 of each other
model's; the manifest must account for every task; every file must pass `tensorlang check` and be in
canonical format. Hand-written PrimFuncs test the translator's rules (reductions, windows, slices,
untranslatable constructs) and that the numerical check does catch a wrong translation.
"""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tensorlang import api
from tensorlang.data.models import MODELS
from tensorlang.parser import format_module

FULLY_CHECKED = "bert-base"
SAMPLE = 3


@pytest.fixture(scope="module", params=MODELS)
def extracted(request, tmp_path_factory):
    from tensorlang.data.extract import extract
    model = request.param
    out = tmp_path_factory.mktemp(model.replace("-", "_"))
    manifest = extract(model, out, small=True, verify=True if model == FULLY_CHECKED else SAMPLE,
                       log=lambda msg: None)
    return model, out, manifest


def test_manifest_accounts_for_every_task(extracted):
    model, out, manifest = extracted
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    tasks = manifest["tasks"]
    assert manifest["model"] == model and manifest["small"] is True
    assert manifest["unique_tasks"] == len(tasks) > 0
    assert manifest["calls"] == sum(t["weight"] for t in tasks) >= len(tasks)
    assert manifest["translated"] + manifest["untranslated"] == len(tasks)
    for t in tasks:
        assert t["task"] and t["weight"] >= 1 and "flops" in t
        assert bool(t.get("file")) != bool(t.get("reason")), t  # a file or a reason, never both or neither
    files = {t["file"] for t in tasks if t.get("file")}
    assert files == {p.name for p in out.glob("*.tsched")}
    # The small configs use nothing the translator lacks: every task is translated.
    assert manifest["untranslated"] == 0, [t["reason"] for t in tasks if t.get("reason")]


def test_translations_match_the_original_primfuncs(extracted):
    model, out, manifest = extracted
    translated = [t for t in manifest["tasks"] if t.get("file")]
    checked = [t for t in translated if "check" in t]
    want = len(translated) if model == FULLY_CHECKED else min(SAMPLE, len(translated))
    assert len(checked) == want == manifest["checked"]
    for t in checked:
        assert t["check"]["ok"], t
        assert t["check"]["max_rel_err"] <= 1e-4, t


def test_files_pass_check_and_are_canonical(extracted):
    model, out, manifest = extracted
    for t in manifest["tasks"]:
        if not t.get("file"):
            continue
        doc = api.load(out / t["file"])
        assert api.check(doc) == [], (t["file"], [d.format(t["file"]) for d in api.check(doc)])
        assert format_module(doc.ast) == doc.text, t["file"]
        assert list(doc.model.ops) == [t["op"]]
        header = doc.text.split("\n\n", 1)[0]
        assert model in header and t["task"] in header and f"occurrences: {t['weight']}" in header
        assert f"FLOPs: {t['flops']}" in header


def test_cli_check_and_fmt_on_an_extracted_file(extracted):
    model, out, manifest = extracted
    if model != FULLY_CHECKED:
        pytest.skip("once is enough")
    path = str(out / manifest["tasks"][0]["file"])
    for args in (["check", path], ["fmt", "--check", path]):
        r = subprocess.run([sys.executable, "-m", "tensorlang", *args], capture_output=True, text=True)
        assert r.returncode == 0, (args, r.stdout, r.stderr)


def test_extract_command_line():
    from tensorlang.data.extract import main
    r = subprocess.run([sys.executable, "-m", "tensorlang.data.extract", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--model" in r.stdout and "--small" in r.stdout
    assert main(["--model", "gpt2", "--seq", "0", "-o", "unused"]) == 2  # refused before any work
    with pytest.raises(SystemExit):
        main(["--model", "gpt3", "-o", "unused"])


# ------------------------------------------------------------------ the translator on hand-written TIR
def _func(src: str):
    import tvm
    return tvm.script.from_source(src)


def _translate_and_check(src: str, name: str = "f"):
    import tvm

    from tensorlang.data.extract import render
    from tensorlang.data.translate import translate
    from tensorlang.data.verify import verify
    func = _func(src)
    tr = translate(func, name)
    text = render(tr.op, ["test"])
    doc = api.load_text(text)
    assert api.check(doc) == [], [d.format("t") for d in api.check(doc)]
    check = verify(tvm.IRModule({"main": func}), tr, doc)
    return tr, text, check


SOFTMAX = '''
@T.prim_func(s_tir=True)
def main(X: T.Buffer((T.int64(4), T.int64(8)), "float32"), Y: T.Buffer((T.int64(4), T.int64(8)), "float32")):
    M = T.sblock_alloc_buffer((T.int64(4),))
    E = T.sblock_alloc_buffer((T.int64(4), T.int64(8)))
    S = T.sblock_alloc_buffer((T.int64(4),))
    for i, k in T.grid(T.int64(4), T.int64(8)):
        with T.sblock("M"):
            v_i, v_k = T.axis.remap("SR", [i, k])
            with T.init():
                M[v_i] = T.float32(-3.4028234663852886e+38)
            M[v_i] = T.max(M[v_i], X[v_i, v_k])
    for i, j in T.grid(T.int64(4), T.int64(8)):
        with T.sblock("E"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            E[v_i, v_j] = T.exp(X[v_i, v_j] - M[v_i])
    for i, k in T.grid(T.int64(4), T.int64(8)):
        with T.sblock("S"):
            v_i, v_k = T.axis.remap("SR", [i, k])
            with T.init():
                S[v_i] = T.float32(0)
            S[v_i] = S[v_i] + E[v_i, v_k]
    for i, j in T.grid(T.int64(4), T.int64(8)):
        with T.sblock("Y"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            Y[v_i, v_j] = E[v_i, v_j] / S[v_i]
'''


def test_reductions_become_max_and_sum_stages():
    tr, text, check = _translate_and_check(SOFTMAX, "softmax")
    assert "M[i] max= X[i, k]" in text
    assert "S[i] += E[i, k]" in text
    assert "Y[i, j] = E[i, j] / S[i]" in text
    assert "M: f32[4]" in text and "E: f32[4, 8]" in text  # intermediates are declared
    assert check.ok and check.against == "original", check


POOL = '''
@T.prim_func(s_tir=True)
def main(X: T.Buffer((T.int64(1), T.int64(2), T.int64(8), T.int64(8)), "float32"),
         P: T.Buffer((T.int64(1), T.int64(2), T.int64(4), T.int64(4)), "float32")):
    pad = T.sblock_alloc_buffer((T.int64(1), T.int64(2), T.int64(10), T.int64(10)))
    for n, c, h, w in T.grid(T.int64(1), T.int64(2), T.int64(10), T.int64(10)):
        with T.sblock("pad"):
            v_n, v_c, v_h, v_w = T.axis.remap("SSSS", [n, c, h, w])
            pad[v_n, v_c, v_h, v_w] = T.if_then_else(T.int64(1) <= v_h and v_h < T.int64(9) and T.int64(1) <= v_w and v_w < T.int64(9), X[v_n, v_c, v_h - T.int64(1), v_w - T.int64(1)], T.float32(-3.4028234663852886e+38))
    for n, c, h, w, rh, rw in T.grid(T.int64(1), T.int64(2), T.int64(4), T.int64(4), T.int64(3), T.int64(3)):
        with T.sblock("P"):
            v_n, v_c, v_h, v_w, v_rh, v_rw = T.axis.remap("SSSSRR", [n, c, h, w, rh, rw])
            with T.init():
                P[v_n, v_c, v_h, v_w] = T.float32(-3.4028234663852886e+38)
            P[v_n, v_c, v_h, v_w] = T.max(P[v_n, v_c, v_h, v_w], pad[v_n, v_c, v_h * T.int64(2) + v_rh, v_w * T.int64(2) + v_rw])
'''


def test_a_pooling_window_becomes_a_window_stage():
    tr, text, check = _translate_and_check(POOL, "pool")
    assert "if 1 <= h < 9 and 1 <= w < 9 else -3.4028234663852886e+38" in text
    assert "P_win: f32[1, 2, 4, 4, 3, 3]" in text
    assert "P_win[n, c, h, w, rh, rw] = pad[n, c, h * 2 + rh, w * 2 + rw]" in text
    assert "P[n, c, h, w] max= P_win[n, c, h, w, rh, rw]" in text
    assert any("window" in n for n in tr.notes)
    assert check.ok, check


SLICE = '''
@T.prim_func(s_tir=True)
def main(X: T.Buffer((T.int64(4), T.int64(16)), "float32"), I: T.Buffer((T.int64(4),), "int64"),
         Y: T.Buffer((T.int64(4), T.int64(8)), "float32")):
    for i, j in T.grid(T.int64(4), T.int64(8)):
        with T.sblock("Y"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            Y[v_i, v_j] = T.Select(T.int64(0) < I[v_i], X[v_i, v_j], T.Cast("float32", v_j) * X[T.min(I[v_i], T.int64(3)), v_j + T.int64(8)])
'''


def test_a_slice_subscript_is_not_bare_and_gathers_stay_in_range():
    tr, text, check = _translate_and_check(SLICE, "slice")
    assert "X[i, j + 0]" in text  # bare, j would take X's extent 16
    assert "f32(j) * X[min(I[i], 3), j + 8]" in text
    assert check.ok, check


TRUNCDIV = '''
@T.prim_func(s_tir=True)
def main(X: T.Buffer((T.int64(8),), "int32"), Y: T.Buffer((T.int64(8),), "int32")):
    for i in range(T.int64(8)):
        with T.sblock("Y"):
            v_i = T.axis.spatial(T.int64(8), i)
            Y[v_i] = T.Div(X[v_i], 3)
'''


def _task(src, name, weight=2):
    import tvm
    return SimpleNamespace(task_name=name, weight=weight, dispatched=[tvm.IRModule({"main": _func(src)})])


def test_an_untranslatable_task_gets_a_reason_and_no_file():
    from tensorlang.data.extract import translate_task
    entry, text = translate_task(_task(TRUNCDIV, "truncdiv"), "m", 1, 2, "cfg")
    assert text is None and entry["file"] is None
    assert "truncating integer division" in entry["reason"]
    entry, text = translate_task(_task(SOFTMAX, "softmax", 3), "m", 2, 2, "cfg")
    assert text is not None, entry.get("reason")
    assert text.startswith("# m (cfg): task softmax (2 of 2)\n# occurrences: 3 ")
    assert entry["check"]["ok"] and entry["weight"] == 3 and entry["op"] == "softmax"


def test_the_numerical_check_catches_a_wrong_translation():
    import dataclasses

    import tvm

    from tensorlang.data.extract import render
    from tensorlang.data.translate import translate
    from tensorlang.data.verify import verify
    from tensorlang.parser import ast as A
    func = _func(SOFTMAX)
    tr = translate(func, "softmax")
    # Y = E / S  ->  Y = E / S * 1.001
    body = tuple(dataclasses.replace(s, rhs=A.BinOp("*", s.rhs, A.Num("1.001")))
                 if isinstance(s, A.Stage) and s.tensor == "Y" else s for s in tr.op.body)
    bad = dataclasses.replace(tr, op=dataclasses.replace(tr.op, body=body))
    doc = api.load_text(render(bad.op, ["wrong"]))
    check = verify(tvm.IRModule({"main": func}), bad, doc)
    assert not check.ok and "differs" in check.message


def test_sample_indices_spread_over_the_tasks():
    from tensorlang.data.extract import sample_indices
    assert sample_indices(10, 3) == {0, 4, 9} or sample_indices(10, 3) == {0, 5, 9}
    assert sample_indices(2, 3) == {0, 1}
    assert sample_indices(5, 0) == set()
