"""Re-encode datasets made under older tensor sentences in today's (`tensorlang data reencode DIR...`).

v2, v3 and v4 -> today (v5) are rewrites of the tokens alone (`upgrade_tiles`): v5 spells an integer outside
the vocabulary as its smooth part's token and the digits of the rest (`NUM> 256 4 3 <NUM`, where v4 and
before wrote `NUM> 1 1 0 0 8 <NUM`: `respell`); v3 says at each tile its loop's extent and what is left to
split after each factor, all of which follow from the factors (they multiply to the extent); v4 writes the
factors innermost first (the outermost is then what is left, forced).
Nothing else about the record changes (its key, task hash and point stay: task keys hash the digits).

v1 -> today (v1 sentences were decoded and encoded anew, as v2 then; as today's now):
v1 sentences described the operator lossily (arithmetic, constants, conditions and index
expressions were dropped), and the task key was a hash of that description, so different
operators could share a key. Nothing needs measuring again: a record's point is its sketch and
decisions, which v2 encodes from the operator's file alone.

- measured records (they carry `sketch` and `decisions`): the task's space is rebuilt for the
  target the record was compiled for (the v1 prompt's CPU, cores and caches, or GPU arch), the
  v1 prompt is checked against that space's v1 prompt (the same task, the same target), the point
  is encoded as v2, the task hash becomes the v2 one (the old one is kept as `task.hash_v1`) and
  the key is recomputed with it (`key_v1`, the original key, is kept as it is);
- pre-training records (sentence only): the v1 sentence is decoded -- its decisions are
  values, TILE factors / CAT index / LOC site index -- checked in today's space (the space
  changed: excluded sketches, the pipelining rule), and encoded as v2; its key is recomputed and
  the old one kept as `key_v1`;
- `metaschedule-N.done` lines (`taskhash|target|machine`) are re-keyed through the records, and so are
  `model-candidates.done`'s (`taskhash|target|machine|model run`).

A record that cannot be re-encoded stays as it was, with `reencode_error` saying why (nothing is
lost); the summary lists them. The dataset is rewritten beside itself and swapped in at the end
(as `relabel` does); a record already current is copied unchanged, so a second run changes nothing.
"""
from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import replace
from pathlib import Path

from tensorlang.data.dataset import SHARD_RECORDS, Writer, read

V1_VERSIONS = ["grammar:1", "vocab:1", "space:1"]
V2_VERSIONS = ["grammar:2", "vocab:2", "space:2"]
V3_VERSIONS = ["grammar:3", "vocab:2", "space:2"]
V4_VERSIONS = ["grammar:4", "vocab:2", "space:2"]
V1_MAX_INT = 8192
# The CPU names that had a token in v1 (analysis/targets.py's KNOWN_CPUS then).
V1_CPUS = ("alderlake", "cascadelake", "haswell", "icelake-server", "sapphirerapids", "skylake", "skylake-avx512",
           "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "znver2", "znver3", "znver4")


# ------------------------------------------------------------------ v1, frozen
def _v1_int(n: int) -> list[str]:
    return [str(n)] if -2 <= n <= V1_MAX_INT else ["NUM>"] + list(str(n)) + ["<NUM"]


def _v1_read_int(tokens: list[str], i: int) -> tuple[int, int]:
    if tokens[i] != "NUM>":
        return int(tokens[i]), i + 1
    j = tokens.index("<NUM", i)
    return int("".join(tokens[i + 1:j])), j + 1


def v1_op_tokens(op) -> list[str]:
    """v1's operator description (what v1 task hashes were made of), exactly as v1 wrote it."""
    from tensorlang.analysis.check import _children
    from tensorlang.analysis.model import FUNCTIONS
    from tensorlang.parser import ast as A

    def accesses(e):
        if isinstance(e, A.Access):
            yield e
        for c in _children(e):
            if not isinstance(e, A.Access):
                yield from accesses(c)

    def functions(e) -> set:
        out = {e.func} if isinstance(e, A.Call) and e.func in FUNCTIONS else set()
        for c in _children(e):
            out |= functions(c)
        return out

    ids = {t.name: n for n, t in enumerate(op.inputs)}
    for st in op.stages:
        ids.setdefault(st.tensor, len(ids))
    out = ["OP"]
    for st in op.stages:
        loops = {ix.name: n for n, ix in enumerate(st.loops)}
        out += ["STAGE", f"t{ids[st.tensor] % 32}", st.dtype, st.reducer or "none"]
        for ix in st.loops:
            out += ["S" if ix.kind == "spatial" else "R"] + _v1_int(ix.extent)
        for acc in accesses(st.ast.rhs):
            out += ["READ", f"t{ids.get(acc.tensor, 0) % 32}"]
            for idx in acc.indices:
                bare = A.strip_parens(idx)
                out.append(f"L{loops[bare.name] % 16}" if isinstance(bare, A.Var) else "E")
        for fn in sorted(functions(st.ast.rhs)):
            out += ["FN", f"fn:{fn}"]
    return out


def v1_hash(op) -> str:
    return hashlib.sha256(" ".join(v1_op_tokens(op)).encode()).hexdigest()[:16]


def v1_target_tokens(target) -> list[str]:
    from tensorlang.analysis.targets import GPU_DEFAULTS, gpu_limits
    out = ["TARGET", target.kind]
    p = target.params
    if target.is_gpu:
        lim = gpu_limits(p)
        arch = p.get("arch", "sm_90")
        out += [f"arch:{arch}" if arch in GPU_DEFAULTS else "arch:generic"]
        out += ["sms"] + _v1_int(lim["sms"]) + ["threads"] + _v1_int(lim["max_threads_per_block"])
        out += ["shared"] + _v1_int(lim["max_shared_memory_per_block"] // 1024)
        return out + ["registers"] + _v1_int(lim["registers_per_block"] // 1024)
    from tensorlang.lower.targets import vector_bits
    from tensorlang.machine import target_cpu
    cpu = target_cpu(p)
    out += [f"cpu:{cpu.name}" if cpu.name in V1_CPUS else "cpu:generic"]
    out += ["cores"] + _v1_int(cpu.cores) + ["vector_bits"] + _v1_int(vector_bits(target))
    return out + ["l1_kb"] + _v1_int(cpu.l1d_bytes // 1024) + ["l2_kb"] + _v1_int(cpu.l2_bytes // 1024)


def v1_prompt(space) -> list[str]:
    from tensorlang.space.sentence import tvm_version
    return V1_VERSIONS + [f"tvm:{tvm_version()}"] + v1_target_tokens(space.target) + v1_op_tokens(space.op)


def parse_v1(tokens: list[str]) -> tuple[list[str], int, tuple]:
    """(prompt, sketch, decisions) of a v1 sentence: after `SKETCH k DECISIONS`, `TILE f..` (factors),
    `CAT i` (the candidate's index), `LOC i` (-2 inline, -1 root, else the consumer's i-th loop)."""
    i = tokens.index("SKETCH")
    prompt = tokens[:i]
    sketch, i = _v1_read_int(tokens, i + 1)
    if tokens[i] != "DECISIONS":
        raise ValueError("no DECISIONS after the sketch")
    i += 1
    decisions: list = []
    while tokens[i] != "[EOS]":
        marker = tokens[i]
        i += 1
        if marker == "TILE":
            factors = []
            while tokens[i] not in ("TILE", "CAT", "LOC", "[EOS]"):
                f, i = _v1_read_int(tokens, i)
                factors.append(f)
            decisions.append(tuple(factors))
        elif marker in ("CAT", "LOC"):
            v, i = _v1_read_int(tokens, i)
            decisions.append(v)
        else:
            raise ValueError(f"unexpected v1 token {marker!r}")
    return prompt, sketch, tuple(decisions)


def v1_target_params(prompt: list[str]) -> dict:
    """The target parameters a v1 prompt states: CPU name, cores and caches, or the GPU arch."""
    i = prompt.index("TARGET")
    kind, name = prompt[i + 1], prompt[i + 2]
    if kind == "cuda":
        return {"arch": name.split(":", 1)[1]} if name != "arch:generic" else {}
    out = {} if name == "cpu:generic" else {"mcpu": name.split(":", 1)[1]}
    for word, param in (("cores", "cores"), ("l1_kb", "l1_kb"), ("l2_kb", "l2_kb")):
        if word in prompt:
            out[param] = _v1_read_int(prompt, prompt.index(word) + 1)[0]
    return out


# ------------------------------------------------------------------ tasks
class _Tasks:
    """Spaces of the tasks met, by (file, op, target name, target parameters): a few kept, since a
    dataset holds a task's records together."""

    def __init__(self, keep: int = 2):
        self.cache: dict = {}
        self.keep = keep
        self.built = 0

    def space(self, file: str, op: str, target: str, params: dict):
        key = (file, op, target, tuple(sorted(params.items())))
        if key in self.cache:
            return self.cache[key]
        from tensorlang import api
        from tensorlang.space.space import Space
        doc = api.load(file)
        if op not in doc.model.ops:
            raise _Refused(f"{file} has no operator {op}")
        tgt = api.resolve_target(doc, target)
        if tgt is None:
            raise _Refused(f"{file} has no target {target}")
        tgt = replace(tgt, params={**tgt.params, **params})
        space = Space(doc.model.ops[op], doc.primfunc(op), tgt)
        self.built += 1
        if len(self.cache) >= self.keep:
            self.cache.pop(next(iter(self.cache)))
        self.cache[key] = space
        return space


class _Refused(Exception):
    pass


def is_current(rec: dict) -> bool:
    from tensorlang.space.sentence import version_tokens
    return rec.get("sentence", "").split(" ", 3)[:3] == version_tokens()[:3]


def respell(tokens: list[str]) -> list[str]:
    """Every integer of a sentence of grammar 4 or before (`NUM> [-] digits <NUM`, read as v1 read it) in
    today's spelling."""
    from tensorlang.space import sentence as S
    return S.respelled(tokens, _v1_read_int, S.int_tokens)


def upgrade_tiles(tokens: list[str]) -> list[str]:
    """A v2, v3 or v4 sentence in today's (v5): its integers respelled (`respell`), and for v2 and v3 each
    tile's values rewritten from its factors alone (`tile_value_tokens`: `= <extent>`, the factors innermost
    first, `= <what is left>` after each but the last). v2 wrote the n factors alone, outermost first; v3 the
    same order with the extents between. Raises ValueError on a malformed sentence or another version."""
    from tensorlang.space import sentence as S
    versions = tokens[:3]
    if versions not in (V2_VERSIONS, V3_VERSIONS, V4_VERSIONS):
        raise ValueError(f"not a v2, v3 or v4 sentence: {' '.join(versions)}")
    tokens = respell(tokens)
    if versions == V4_VERSIONS:
        return S.version_tokens()[:3] + tokens[3:]
    out = S.version_tokens()[:3] + tokens[3:tokens.index("DECISIONS") + 1]
    i = len(out)
    while i < len(tokens):
        if tokens[i] != "TILE":
            out.append(tokens[i])
            i += 1
            continue
        j = i + 1
        while not S.is_loop_word(tokens[j]):
            j += 1
        while S.is_loop_word(tokens[j]):
            j += 1
        n, j = S.read_int(tokens, j)
        out += tokens[i:j]  # the head, as it was
        factors = []
        for _ in range(n):
            if versions == V3_VERSIONS:  # `= <extent>` or `= <what is left>` before each factor
                if tokens[j] != "=":
                    raise ValueError(f"token {j}: {tokens[j]!r} where a v3 tile has `=`")
                _, j = S.read_int(tokens, j + 1)
            f, j = S.read_int(tokens, j)
            factors.append(f)
        out += S.tile_value_tokens(factors)
        i = j
    return out


def reencode_record(rec: dict, tasks: _Tasks) -> dict:
    """A v1 record in today's sentences (raises _Refused with the reason it cannot be)."""
    from tensorlang.data.collect import op_hash, record_key
    from tensorlang.space import sentence as S
    from tensorlang.space.space import Point
    tokens = rec["sentence"].split()
    try:
        prompt, sketch, decisions = parse_v1(tokens)
    except (ValueError, IndexError) as e:
        raise _Refused(f"not a v1 sentence: {e}") from None
    if prompt[:3] != V1_VERSIONS:
        raise _Refused(f"made under {' '.join(prompt[:3])}")
    measured = "decisions" in rec
    if measured:  # the stored point is the truth; the sentence must agree with it
        stored = tuple(tuple(d) if isinstance(d, list) else d for d in rec["decisions"])
        if (rec["sketch"], stored) != (sketch, decisions):
            raise _Refused("the v1 sentence's decisions differ from the record's")
    params = v1_target_params(prompt)
    try:
        space = tasks.space(rec["task"]["file"], rec["task"]["op"], rec["target"], params)
    except (OSError, _Refused) as e:
        raise _Refused(f"task not rebuilt: {e}") from None
    if v1_prompt(space) != prompt:
        raise _Refused("the v1 prompt is not the rebuilt task's (the workload or target changed)")
    old_hash = rec["task"]["hash"]
    if v1_hash(space.op) != old_hash:
        raise _Refused(f"the v1 task hash {old_hash} is not the rebuilt operator's")
    try:
        sentence = S.encode(space, Point(sketch, decisions))
    except (S.SentenceError, ValueError, IndexError) as e:
        raise _Refused(f"not a point of space {S.SPACE_VERSION}: {e}") from None
    tkey = op_hash(space.op)
    out = {k: v for k, v in rec.items() if k not in ("sha256", "reencode_error")}
    out["task"] = {**rec["task"], "hash": tkey, "hash_v1": old_hash}
    out["sentence"] = " ".join(sentence)
    if measured:
        out["versions"] = S.version_tokens()
        out["key"] = record_key(tkey, rec["target"], rec["machine"], sketch, decisions)
        out.setdefault("key_v1", rec["key"])  # a record re-labelled before keeps its original key
    else:
        out["key"] = hashlib.sha256(f"{tkey}|{rec['target']}|{sketch}|{decisions}".encode()).hexdigest()
        out["key_v1"] = rec["key"]
    return out


def _upgraded_tiles(rec: dict) -> dict:
    from tensorlang.space import sentence as S
    out = {k: v for k, v in rec.items() if k != "sha256"}
    out["sentence"] = " ".join(upgrade_tiles(rec["sentence"].split()))
    if "versions" in rec:
        out["versions"] = S.version_tokens()
    return out


def reencode(root: str | Path, budget_min: float | None = None, log=print) -> dict:
    """Rewrite the dataset at `root` in today's sentences. With `budget_min`, records of tasks first met after that many
    minutes are copied unchanged (v1) and counted as `deferred`: a later run re-encodes them."""
    root = Path(root)
    new = root.with_name(root.name + ".reencode")
    shutil.rmtree(new, ignore_errors=True)
    tasks = _Tasks()
    counts = {"records": 0, "reencoded": 0, "upgraded_v2": 0, "upgraded_v3": 0, "upgraded_v4": 0, "already_current": 0,
              "refused": 0, "deferred": 0,
              "duplicates": 0}
    refused: dict = {}
    hashes: dict = {}  # (v1 hash, target, machine) -> v2 hashes (for the .done files)
    start = time.time()
    seen_tasks: set = set()
    deferred_tasks: set = set()
    shard = 20000 if "pretrain" in str(root) else SHARD_RECORDS
    with Writer(new, shard_records=shard) as w:
        for rec in read(root):
            counts["records"] += 1
            task = (rec["task"]["file"], rec["task"]["op"], rec["target"])
            if task not in seen_tasks:
                seen_tasks.add(task)
                if budget_min is not None and time.time() - start > budget_min * 60:
                    deferred_tasks.add(task)
                if len(seen_tasks) % 25 == 0:
                    log(f"  {root}: {len(seen_tasks)} tasks, {counts['records']} records, "
                        f"{time.time() - start:.0f} s")
            if is_current(rec):
                out, kind = rec, "already_current"
            elif (versions := rec.get("sentence", "").split(" ", 3)[:3]) in (V2_VERSIONS, V3_VERSIONS, V4_VERSIONS):
                out, kind = _upgraded_tiles(rec), f"upgraded_v{versions[0].split(':')[1]}"
                h = rec["task"]["hash"]  # keys stay: the .done lines map to themselves
                hashes.setdefault((h, rec["target"], rec.get("machine")), set()).add(h)
            elif task in deferred_tasks:
                out, kind = rec, "deferred"
            else:
                try:
                    out, kind = reencode_record(rec, tasks), "reencoded"
                    hashes.setdefault((out["task"]["hash_v1"], rec["target"], rec.get("machine")), set()).add(
                        out["task"]["hash"])
                except _Refused as e:
                    reason = str(e)
                    out = {**{k: v for k, v in rec.items() if k != "sha256"}, "reencode_error": reason}
                    kind = "refused"
                    refused.setdefault(reason, []).append(f"{rec['task']['file']}:{rec['task']['op']} {rec['key'][:12]}")
            if w.append(out):
                counts[kind] += 1
            else:
                counts["duplicates"] += 1
        w.close(compress_open=True)
    done_unmapped = []
    for done in root.glob("*.done"):
        lines = []
        for line in done.read_text().split():
            h, target, machine, *rest = line.split("|")  # model-candidates.done: then the model's run
            mapped = hashes.get((h, target, machine))
            if mapped:
                lines += ["|".join([n, target, machine, *rest]) for n in sorted(mapped)]
            else:
                lines.append(line)
                if not any(k[0] == h for k in hashes) and line not in done_unmapped:
                    done_unmapped.append(line)
        (new / done.name).write_text("".join(x + "\n" for x in lines))
    old = root.with_name(root.name + ".v1")
    shutil.rmtree(old, ignore_errors=True)
    root.rename(old)
    new.rename(root)
    shutil.rmtree(old)
    counts.update(tasks=len(seen_tasks), spaces_built=tasks.built, seconds=round(time.time() - start, 1),
                  refused_reasons={r: len(v) for r, v in refused.items()},
                  refused_examples={r: v[:5] for r, v in refused.items()}, done_lines_unmapped=done_unmapped,
                  deferred_tasks=len(deferred_tasks))
    return counts


def main_reencode(args) -> int:
    import json
    for d in args.dirs:
        summary = reencode(d, budget_min=args.budget)
        print(f"{d}: {json.dumps(summary, indent=1)}")
    return 0
