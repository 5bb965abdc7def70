"""Tensor sentences: (target, operator, schedule) as a token sequence for the language model.

    <versions> TARGET <features> OP <canonical stages> SKETCH k DECISIONS <d1> <d2> ... EOS

- versions: `grammar:1 vocab:1 space:1 tvm:<version>`: a sentence made under another space or
  vocabulary is detected when decoded, never silently misread;
- target features: kind, CPU name or GPU arch, cores / SMs, vector width, memory limits;
- the operator in a canonical, name-independent form: each stage's loops (role and extent), its
  reduction, dtype, and reads (tensor number and, per dimension, the loop it is indexed by or E
  for an expression);
- the schedule: which sketch (its trace skeleton is fixed by the operator, the target and the
  space version), then its decisions in replay order (the OSDI'24 TLM's split between skeleton and
  decisions). A tile decision is its factors, one token each; a categorical one the index of the
  candidate; a compute-at site its index (-2 inline, -1 root).

Every integer from -2 to 8192 is a token; a larger one is written `NUM> digits <NUM`.
`NextTokens` gives, for any prefix of the schedule part, exactly the legal next tokens (the
decision's domain, narrowed factor by factor for tiles), replaying the sketch incrementally.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import replace
from pathlib import Path

import tvm_ffi  # noqa: F401  (cheap; TVM itself is imported by the space)

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.model import FUNCTIONS, OpModel
from tensorlang.analysis.targets import KNOWN_CPUS, GPU_DEFAULTS
from tensorlang.parser import ast as A
from tensorlang.space.space import TILE, DecisionPoint, Point, Space

GRAMMAR_VERSION, VOCAB_VERSION, SPACE_VERSION = 1, 1, 1
MAX_INT = 8192
MAX_TENSORS, MAX_LOOPS = 32, 16
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "[SEP]", "[MASK]", "[CLS]"]
STRUCTURE = ["TARGET", "OP", "STAGE", "READ", "FN", "SKETCH", "DECISIONS", "TILE", "CAT", "LOC", "S", "R", "E",
             "NUM>", "<NUM", "sum", "max", "min", "none", "llvm", "cuda", "cores", "sms", "vector_bits", "l1_kb",
             "l2_kb", "threads", "shared", "registers", "cpu:generic", "arch:generic"]
EOS = "[EOS]"


def tvm_version() -> str:
    try:
        from importlib.metadata import version
        return version("apache-tvm")
    except Exception:  # not installed as a distribution
        return "unknown"


def version_tokens() -> list[str]:
    return [f"grammar:{GRAMMAR_VERSION}", f"vocab:{VOCAB_VERSION}", f"space:{SPACE_VERSION}", f"tvm:{tvm_version()}"]


def vocabulary() -> list[str]:
    """The fixed vocabulary, in id order (written to `vocab.txt` by `write_vocabulary`)."""
    words = SPECIALS + STRUCTURE + version_tokens()
    words += [f"cpu:{c}" for c in sorted(KNOWN_CPUS)] + [f"arch:{a}" for a in sorted(GPU_DEFAULTS)]
    words += sorted(D.TVM_DTYPE) + [f"fn:{f}" for f in sorted(FUNCTIONS)]
    words += [f"t{i}" for i in range(MAX_TENSORS)] + [f"L{i}" for i in range(MAX_LOOPS)]
    words += [str(i) for i in range(-2, MAX_INT + 1)]
    return words


_VOCAB: dict[str, int] | None = None


def token_ids() -> dict[str, int]:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = {w: i for i, w in enumerate(vocabulary())}
    return _VOCAB


def write_vocabulary(path: str | Path) -> None:
    Path(path).write_text("\n".join(vocabulary()) + "\n")


# ----------------------------------------------------------------- integers
def int_tokens(n: int) -> list[str]:
    if -2 <= n <= MAX_INT:
        return [str(n)]
    return ["NUM>"] + list(str(n)) + ["<NUM"]


def read_int(tokens: list[str], i: int) -> tuple[int, int]:
    if tokens[i] != "NUM>":
        return int(tokens[i]), i + 1
    j = tokens.index("<NUM", i)
    return int("".join(tokens[i + 1:j])), j + 1


# ------------------------------------------------------------------- prompt
def target_tokens(target) -> list[str]:
    out = ["TARGET", target.kind]
    p = target.params
    if target.is_gpu:
        from tensorlang.analysis.targets import gpu_limits
        lim = gpu_limits(p)
        arch = p.get("arch", "sm_90")
        out += [f"arch:{arch}" if arch in GPU_DEFAULTS else "arch:generic"]
        out += ["sms"] + int_tokens(lim["sms"]) + ["threads"] + int_tokens(lim["max_threads_per_block"])
        out += ["shared"] + int_tokens(lim["max_shared_memory_per_block"] // 1024)
        out += ["registers"] + int_tokens(lim["registers_per_block"] // 1024)
        return out
    from tensorlang.lower.targets import vector_bits
    from tensorlang.machine import target_cpu
    cpu = target_cpu(p)
    out += [f"cpu:{cpu.name}" if cpu.name in KNOWN_CPUS else "cpu:generic"]
    out += ["cores"] + int_tokens(cpu.cores) + ["vector_bits"] + int_tokens(vector_bits(target))
    out += ["l1_kb"] + int_tokens(cpu.l1d_bytes // 1024) + ["l2_kb"] + int_tokens(cpu.l2_bytes // 1024)
    return out


def op_tokens(op: OpModel) -> list[str]:
    """The operator, independent of the names its author chose."""
    tensor_ids = {t.name: n for n, t in enumerate(op.inputs)}
    for st in op.stages:
        tensor_ids.setdefault(st.tensor, len(tensor_ids))
    out = ["OP"]
    for st in op.stages:
        loop_ids = {ix.name: n for n, ix in enumerate(st.loops)}
        out += ["STAGE", f"t{tensor_ids[st.tensor] % MAX_TENSORS}", st.dtype, st.reducer or "none"]
        for ix in st.loops:
            out += ["S" if ix.kind == "spatial" else "R"] + int_tokens(ix.extent)
        for acc in _accesses(st.ast.rhs):
            out += ["READ", f"t{tensor_ids.get(acc.tensor, 0) % MAX_TENSORS}"]
            for idx in acc.indices:
                bare = A.strip_parens(idx)
                out.append(f"L{loop_ids[bare.name] % MAX_LOOPS}" if isinstance(bare, A.Var) else "E")
        for fn in sorted(_functions(st.ast.rhs)):
            out += ["FN", f"fn:{fn}"]
    return out


def _accesses(e):
    from tensorlang.analysis.check import _children
    if isinstance(e, A.Access):
        yield e
    for c in _children(e):
        if not isinstance(e, A.Access):
            yield from _accesses(c)


def _functions(e) -> set[str]:
    from tensorlang.analysis.check import _children
    out = {e.func} if isinstance(e, A.Call) and e.func in FUNCTIONS else set()
    for c in _children(e):
        out |= _functions(c)
    return out


def prompt_tokens(space: Space) -> list[str]:
    return version_tokens() + target_tokens(space.target) + op_tokens(space.op)


# -------------------------------------------------------------- decisions
def decision_tokens(kind: str, value) -> list[str]:
    if kind == TILE:
        return [t for f in value for t in int_tokens(f)]
    return int_tokens(int(value))


def encode(space: Space, point: Point, kinds: list[str] | None = None) -> list[str]:
    """The whole sentence of a point. `kinds` (one per decision) saves a replay when known."""
    kinds = decision_kinds(space, point) if kinds is None else kinds
    out = prompt_tokens(space) + ["SKETCH"] + int_tokens(point.sketch) + ["DECISIONS"]
    for kind, value in zip(kinds, point.decisions):
        out += [{"tile": "TILE", "categorical": "CAT", "location": "LOC"}[kind]] + decision_tokens(kind, value)
    return out + [EOS]


def decision_kinds(space: Space, point: Point) -> list[str]:
    kinds = []
    it = iter(point.decisions)
    space.replay(point.sketch, lambda p, prefix: (kinds.append(p.kind), next(it))[1], convert=False)
    return kinds


class SentenceError(ValueError):
    pass


def decode(space: Space, tokens: list[str]) -> tuple[int, tuple]:
    """(sketch, decisions) of a sentence for this space; refuses sentences of another version or prompt."""
    want = prompt_tokens(space)
    if tokens[:4] != want[:4]:
        raise SentenceError(f"sentence made under {' '.join(tokens[:4])}; this space is {' '.join(want[:4])}")
    if tokens[:len(want)] != want:
        raise SentenceError("the sentence's target or operator differs from this space's")
    nt = NextTokens(space)
    try:
        for tok in tokens[len(want):]:
            if tok not in nt.allowed():
                raise SentenceError(f"token {tok!r} is not legal here; legal: {sorted(nt.allowed())[:20]}")
            nt.push(tok)
        if not nt.done:
            raise SentenceError("the sentence ends before its last decision")
        return nt.sketch, tuple(nt.decisions)
    finally:
        nt.close()


# ------------------------------------------------------------- next tokens
class NextTokens:
    """The legal next tokens of the schedule part of a sentence, one token at a time.

    The sketch is replayed in a background thread that stops at each decision until it is made.
    A decision whose domain cannot depend on the ones before it (Space.static_points: categoricals,
    tiles of untouched loops -- narrowed by the GPU limits where the target has them) is answered
    at once from the sketch's table, and so is any decision an earlier replay met after the same
    decisions (Space.point_memo); only the other compute-at sites and, where a
    postprocessor could refuse, the end of the sentence hand the decisions made so far to the
    replay and wait for it.
    """

    def __init__(self, space: Space):
        self.space = space
        self.tokens: list[str] = []
        self.sketch: int | None = None
        self.decisions: list = []
        self.done = False
        self._state = "SKETCH"  # SKETCH -> sketch index -> DECISIONS -> (kind marker, values)* -> EOS
        self._point: DecisionPoint | None = None
        self._partial: list[int] = []  # tile factors emitted so far
        self._to_replay: queue.Queue = queue.Queue()
        self._from_replay: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._big: list[str] | None = None  # digits of a NUM> ... <NUM being read
        self._static: list = []  # per decision index: its DecisionPoint when static, else None
        self._received = 0  # decision messages read from the replay thread
        self._fed = 0  # decisions handed to the replay thread
        self._ended = False  # the replay has finished (or failed)

    # -- the replay thread
    def _run(self, sketch: int):
        def choose(point, prefix):
            self._from_replay.put(("decision", point))
            value = self._to_replay.get()
            if value is _STOP:
                raise _Stopped()
            return value
        try:
            self.space.replay(sketch, choose, convert=False)
            self._from_replay.put(("end", None))
        except _Stopped:
            pass
        except Exception as e:  # e.g. postprocessors refusing a GPU point
            self._from_replay.put(("error", e))

    def _advance(self):
        """Move to the next decision: from the static table when it is there, else from the replay."""
        k = len(self.decisions)
        static = self._static[k] if k < len(self._static) else None
        if static is None and k < len(self._static):  # a decision some replay has met after this prefix
            static = self.space.point_memo.get((self.sketch, tuple(self.decisions)))
        if static is not None:
            gpu = self.space.gpu_models[self.sketch]
            if gpu is not None and static.kind == TILE:
                static = replace(static, domain=gpu.restrict(k, static.domain, tuple(self.decisions)))
            self._point, self._state = static, "MARK"
            return
        if k == len(self._static) and self.space.refusal_free(self.sketch):
            # every decision made: the point is legal (no postprocessor refuses a point of this sketch
            # whose decisions are in their domains); `finish` replays it when the schedule is wanted
            self._point, self._state = None, "EOS"
            return
        self._drain(k)

    def _drain(self, k: int) -> None:
        """Hand the decisions made so far to the replay and read its messages up to decision k (or its
        end). The replay starts at the first such need, and gets the decisions only then, in one go:
        left running beside the static steps it would hold the GIL for up to a switch interval (5 ms)
        at every step."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(self.sketch,), daemon=True)
            self._thread.start()
        for value in self.decisions[self._fed:]:
            self._to_replay.put(value)
        self._fed = len(self.decisions)
        while True:  # read the replay's messages up to this decision (or its end)
            kind, payload = self._from_replay.get()
            if kind == "decision":
                self._received += 1
                if self._received == k + 1:
                    self._point, self._state = payload, "MARK"
                    return
            elif kind == "end":
                self._point, self._state, self._ended = None, "EOS", True
                return
            else:
                self._point, self._state, self._ended = None, "ERROR", True
                self.error = payload
                return

    # -- the API
    def allowed(self) -> set[str]:
        s = self._state
        if s == "SKETCH":
            return {"SKETCH"}
        if s == "SKETCH_INDEX":
            return {t for k in self.space.usable for t in int_tokens(k)[:1]}
        if s == "DECISIONS":
            return {"DECISIONS"}
        if s == "MARK":
            return {{"tile": "TILE", "categorical": "CAT", "location": "LOC"}[self._point.kind]}
        if s == "VALUE":
            return self._value_tokens()
        if s == "EOS":
            return {EOS}
        return set()

    def _value_tokens(self) -> set[str]:
        p = self._point
        if p.kind == TILE:
            k = len(self._partial)
            values = {f[k] for f in p.domain if list(f[:k]) == self._partial}
        else:
            values = set(p.domain)
        if self._big is not None:  # inside NUM> ...: the next digit or the end
            prefix = "".join(self._big)
            out = {str(v)[len(prefix)] for v in values if str(v).startswith(prefix) and len(str(v)) > len(prefix)}
            if any(str(v) == prefix for v in values):
                out.add("<NUM")
            return out
        return {int_tokens(v)[0] for v in values}

    def push(self, tok: str) -> None:
        if tok not in self.allowed():
            raise SentenceError(f"token {tok!r} is not legal here")
        self.tokens.append(tok)
        s = self._state
        if s == "SKETCH":
            self._state = "SKETCH_INDEX"
        elif s == "SKETCH_INDEX":
            self.sketch = int(tok)
            self._state = "DECISIONS"
        elif s == "DECISIONS":
            self._static = self.space.static_points(self.sketch)
            self._advance()
        elif s == "MARK":
            self._state, self._partial = "VALUE", []
        elif s == "VALUE":
            self._value(tok)
        elif s == "EOS":
            self.done, self._state = True, "DONE"

    def _value(self, tok: str):
        if tok == "NUM>":
            self._big = []
            return
        if self._big is not None:
            if tok != "<NUM":
                self._big.append(tok)
                return
            value, self._big = int("".join(self._big)), None
        else:
            value = int(tok)
        p = self._point
        if p.kind == TILE:
            self._partial.append(value)
            if len(self._partial) < p.n:
                return
            decided = tuple(self._partial)
        else:
            decided = value
        self.decisions.append(decided)
        self._advance()

    def finish(self) -> None:
        """After EOS: complete the replay (postprocessors included); raises what it raised."""
        if not self.done:
            raise SentenceError("the sentence is not finished")
        if not self._ended:
            self._drain(len(self.decisions) + 1)
            if self._state == "ERROR":
                raise self.error
            self._state = "DONE"

    def close(self):
        if self._thread is not None and self._thread.is_alive():
            self._to_replay.put(_STOP)
            self._thread.join(timeout=5)


class _Stopped(Exception):
    pass


_STOP = object()
