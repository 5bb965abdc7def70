"""Tensor sentences: (target, operator, schedule) as a token sequence for the language model.

    <versions> TARGET <features> OP <operator> SKETCH k DECISIONS <decision>* [EOS]

Version 5 (docs/language.md §9 has the grammar and an example; v3 was v2 with each tile's extents said, v4
v3 with each tile's factors innermost first, v5 is v4 with an integer outside the vocabulary spelled as its
smooth part's token and the digits of the rest).
The prompt (everything before SKETCH) says everything about the task, so that the operator can be
rebuilt from it alone (`op_source`) and the task key is a hash of it:

- versions: `grammar:5 vocab:2 space:2 tvm:<version>`; a sentence of another version is refused
  (`tensorlang data reencode` rewrites v1 ... v4 datasets);
- target: LLVM's CPU name where it has a token (`cpu:znver4`, else `cpu:generic`), cores, vector
  width, L1d/L2 per core and the SIMD families (`isa:avx512f` ...), so CPUs without a token of
  their own are still told apart; for CUDA the architecture and the limits the space uses;
- operator: every input (`IN t0 f32 [ 1 64 56 56 ]`), then per stage its tensor, dtype, shape,
  reduction extents, operator (`=`, `+=`, `max=`, `min=`) and right-hand side as a prefix
  expression over canonical names (tensors t0.. in signature then stage order, loops L0.. in loop
  order); a subscript is an affine form of loop ids (`L2 + L5 - 1`) or `~` and a prefix expression;
  integers exact, floats one token for a small table, else `FLT m e` (exactly m * 10**e); then
  `OUT` and the outputs;
- schedule: the sketch, then each decision introduced by its instruction and subject:
  `TILE <block> <loop> <n>`, `= <extent>` and the n factors innermost first, each but the last followed
  by `= <what is left to split>` (`TILE t3 L1 4 = 64 8 = 8 2 = 4 4 = 1 1` is the tile (1, 4, 2, 8): the
  extent and the rest are forced tokens, there so that a small model sees at each factor what it divides
  -- v2 left it to find the extent in the prompt, and a 3-layer model chose the same factors for every
  shape). Innermost first: the factors that decide the vector and register tiles are chosen while
  anything is still possible, and the outermost (the parallel loop) takes what is left -- v3 chose
  outermost first, and a model that chose 1 for the middle factors left the innermost to take the rest
  (a 64x7x7 register tile, a 1-wide unvectorised column); `UNROLL`, `VECTOR <block>`,
  `THREADS <block> <loop>` and the value chosen (not its index); `LOC <block>` and the site: `inline`, `root`, or
  `<block> <loop>`. Blocks are tensors plus the words of blocks a sketch made (`t3 rf`, `t0 shared`);
  a loop is named by the block iterators it runs over: `L4` (the whole of L4), `L4 .1` (the second
  of the loops L4 is split into), `L2 & L3` (a fusion).

Integers in a fixed set (INTS: -2..256 and the 7-smooth numbers up to 65536, the sizes and tile
factors models have) are one token; any other is `NUM> s digits <NUM`: its largest 7-smooth divisor with
a token, then the digits of the rest (11008 = 256 * 43: `NUM> 256 4 3 <NUM`), so that what divides it is a
token (task keys hash the digits alone, `digits_spelled`). `NextTokens` gives, for any
prefix of the schedule part, exactly the legal next tokens (or a mask over the vocabulary),
replaying the sketch incrementally; forced tokens (one legal choice) are flagged for a decoder.
"""
from __future__ import annotations

import decimal
import functools
import math
import queue
import sys
import threading
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import tvm_ffi  # noqa: F401  (cheap; TVM itself is imported by the space)

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.model import FUNCTIONS, OpModel
from tensorlang.analysis.targets import GPU_DEFAULTS, KNOWN_CPUS
from tensorlang.parser import ast as A
from tensorlang.space.space import (CATEGORICAL, LOCATION, TILE, DecisionPoint, Point, Space, candidate_sites,
                                    runs_once)

GRAMMAR_VERSION, VOCAB_VERSION, SPACE_VERSION = 5, 2, 2
MAX_TENSORS, MAX_LOOPS, MAX_PARTS = 64, 16, 16
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "[SEP]", "[MASK]", "[CLS]"]
QUALITY = ["Q0", "Q1", "Q2", "Q3"]  # measured-quality buckets, reserved for the model's prompts
EOS = "[EOS]"
# CPU names with a token of their own: the completion list plus the CPUs this project meets.
CPU_NAMES = tuple(sorted(set(KNOWN_CPUS) | {"emeraldrapids", "graniterapids", "znver5", "icelake-client",
                                              "tigerlake", "rocketlake", "meteorlake", "arrowlake",
                                              "sierraforest", "neoverse-v1", "neoverse-v2", "neoverse-n1"}))
# The SIMD families that tell CPUs apart (a CPU's `simd` features, as LLVM names them, in this order).
# (Flags every CPU with a later family has, such as f16c or avx512dq/vl/cd, are left out.)
ISA = ("sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avx512bf16", "avx512fp16", "avx512vbmi",
       "avxvnni", "amx-tile", "amx-bf16", "amx-int8")
TARGET_WORDS = ["TARGET", "llvm", "cuda", "cores", "vector_bits", "l1_kb", "l2_kb", "sms", "threads", "shared",
                "registers", "vthreads", "warp", "cpu:generic", "arch:generic"]
OP_WORDS = ["OP", "IN", "STAGE", "OUT", "R", "[", "]", ",", "=", "+=", "max=", "min=", "FLT", "~"]
EXPR_WORDS = ["+", "-", "*", "/", "//", "%", "**", "neg", "<", "<=", ">", ">=", "==", "!=", "and", "or", "not",
              "if"]
SCHEDULE_WORDS = ["SKETCH", "DECISIONS", "TILE", "UNROLL", "UNROLL_IMPLICIT", "VECTOR", "THREADS", "CAT", "UNUSED", "LOC",
                  "inline", "root", "&", "free", "#", "NUM>", "<NUM"]
# Words of the blocks a sketch makes, after the tensor's name: A_shared, C_local, S_rf, C_init ("shared" and
# "warp" are target words too).
BLOCK_WORDS = ["rf", "local", "global", "init", "dyn", "wmma", "accumulator", "cache", "red",
               "temp", "reindex", "pad", "in", "out", "block?", "word?"]
_BLOCK_WORDS = set(BLOCK_WORDS) | {"shared", "warp"}
# Floats with a token of their own; any other is FLT m e.
FLOAT_TABLE = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0)


def _smooth(n: int) -> bool:
    for p in (2, 3, 5, 7):
        while n % p == 0:
            n //= p
    return n == 1


# Integers with a token of their own: every small one, and the 7-smooth ones (products of 2, 3, 5, 7:
# the shapes and tile factors of the models we meet; 11008 = 2^8 * 43 is written in digits).
INTS = tuple(range(-2, 257)) + tuple(n for n in range(257, 65537) if _smooth(n))
_INT_SET = frozenset(INTS)


@functools.lru_cache(maxsize=1)
def tvm_version() -> str:
    try:
        from importlib.metadata import version
        return version("apache-tvm")
    except Exception:  # not installed (a lent GPU machine that only trains): the version the project pins
        import re
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        pin = re.search(r'"apache-tvm==([^"]+)"', pyproject.read_text()) if pyproject.exists() else None
        return pin.group(1) if pin else "unknown"


def version_tokens() -> list[str]:
    return [f"grammar:{GRAMMAR_VERSION}", f"vocab:{VOCAB_VERSION}", f"space:{SPACE_VERSION}", f"tvm:{tvm_version()}"]


def vocabulary() -> list[str]:
    """The fixed vocabulary, in id order (also `tensorlang.lm.tokenizer`'s)."""
    words = SPECIALS + QUALITY + TARGET_WORDS + OP_WORDS + EXPR_WORDS + SCHEDULE_WORDS + version_tokens()
    words += [f"cpu:{c}" for c in CPU_NAMES] + [f"isa:{f}" for f in ISA] + [f"arch:{a}" for a in sorted(GPU_DEFAULTS)]
    words += sorted(D.TVM_DTYPE) + [f"fn:{f}" for f in sorted(FUNCTIONS)] + [f"cast:{d}" for d in sorted(D.TVM_DTYPE)]
    words += [f"t{i}" for i in range(MAX_TENSORS)] + [f"L{i}" for i in range(MAX_LOOPS)]
    words += [f".{i}" for i in range(MAX_PARTS)] + BLOCK_WORDS + [_float_word(v) for v in FLOAT_TABLE]
    words += [str(i) for i in INTS]
    return words


_VOCAB: dict[str, int] | None = None


def token_ids() -> dict[str, int]:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = {w: i for i, w in enumerate(vocabulary())}
    return _VOCAB


def write_vocabulary(path: str | Path) -> None:
    Path(path).write_text("\n".join(vocabulary()) + "\n")


class SentenceError(ValueError):
    pass


# ----------------------------------------------------------------- numbers
def smooth_part(n: int) -> int:
    """The largest divisor of n > 0 made of 2s, then 3s, 5s and 7s, that has a token (at most 65536)."""
    s = 1
    for p in (2, 3, 5, 7):
        while n % (s * p) == 0 and s * p <= INTS[-1]:
            s *= p
    return s


def int_tokens(n: int) -> list[str]:
    """An integer's tokens: one token if it has one, else `NUM> [-] s digits <NUM` -- s its smooth part's token
    (`smooth_part`), then the digits of what is left (11008 = 256 * 43: `NUM> 256 4 3 <NUM`; 50257:
    `NUM> 1 5 0 2 5 7 <NUM`). Grammar 4 spelled the digits alone, and a model could not read off
    `NUM> 1 1 0 0 8 <NUM` that 16 divides it: it split LLaMA's 11008-wide loop with an innermost 1 as it
    had learnt for GPT-2's 50257 = 29 * 1733."""
    if n in _INT_SET:
        return [str(n)]
    s = smooth_part(abs(n))
    rest = abs(n) // s  # no digits for a rest of 1 (a negative smooth number: -5 is `NUM> - 5 <NUM`)
    return ["NUM>"] + (["-"] if n < 0 else []) + [str(s)] + (list(str(rest)) if rest > 1 else []) + ["<NUM"]


def read_int(tokens: list[str], i: int) -> tuple[int, int]:
    """(value, index after it) of the integer at tokens[i]."""
    if tokens[i] != "NUM>":
        return int(tokens[i]), i + 1
    j = tokens.index("<NUM", i)
    sign, k = (-1, i + 2) if tokens[i + 1] == "-" else (1, i + 1)
    return sign * int(tokens[k]) * int("".join(tokens[k + 1:j]) or 1), j + 1


def respelled(tokens: list[str], read: Callable, spell: Callable) -> list[str]:
    """`tokens` with every `NUM> ... <NUM` read by `read` (tokens, i -> value, index after it) and written
    anew by `spell` (value -> tokens); every other token as it is."""
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] != "NUM>":
            out.append(tokens[i])
            i += 1
            continue
        n, i = read(tokens, i)
        out += spell(n)
    return out


def digits_spelled(tokens: list[str]) -> list[str]:
    """`tokens` with every `NUM> ... <NUM` spelled in digits alone, as grammar 4 wrote it: the form task keys
    hash (`data.collect.op_hash`), so that a task keeps its key across spellings (the held-out split, the
    validation tasks, the measured records' keys)."""
    return respelled(tokens, read_int, lambda n: ["NUM>"] + (["-"] if n < 0 else []) + list(str(abs(n))) + ["<NUM"])


def _float_word(v: float) -> str:
    return repr(float(v))


def float_tokens(v: float) -> list[str]:
    """A float literal, exactly: a token of its own when in FLOAT_TABLE, else FLT m e for m * 10**e
    (m, e from the shortest decimal that reads back as the same double)."""
    if v in FLOAT_TABLE:
        return [_float_word(v)]
    sign, digits, exp = decimal.Decimal(repr(float(v))).as_tuple()
    m = int("".join(map(str, digits)))
    while m and m % 10 == 0:
        m, exp = m // 10, exp + 1
    return ["FLT"] + int_tokens(-m if sign else m) + int_tokens(exp)


# ------------------------------------------------------------------ target
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
        out += ["vthreads"] + int_tokens(lim["max_vthread"]) + ["warp"] + int_tokens(lim["warp_size"])
        return out
    from tensorlang.lower.targets import vector_bits
    from tensorlang.machine import target_cpu
    cpu = target_cpu(p)
    out += [f"cpu:{cpu.name}" if cpu.name in CPU_NAMES else "cpu:generic"]
    out += ["cores"] + int_tokens(cpu.cores) + ["vector_bits"] + int_tokens(vector_bits(target))
    out += ["l1_kb"] + int_tokens(cpu.l1d_bytes // 1024) + ["l2_kb"] + int_tokens(cpu.l2_bytes // 1024)
    return out + [f"isa:{f}" for f in ISA if f in cpu.features]


# ---------------------------------------------------------------- operator
def tensor_ids(op: OpModel) -> dict[str, int]:
    """Canonical tensor numbers: inputs in signature order, then the stages' tensors in stage order."""
    ids = {t.name: n for n, t in enumerate(op.inputs)}
    for st in op.stages:
        ids.setdefault(st.tensor, len(ids))
    return ids


def _tensor(n: int) -> str:
    if n >= MAX_TENSORS:
        raise SentenceError(f"an operator of more than {MAX_TENSORS} tensors has no sentence")
    return f"t{n}"


def _loop(n: int) -> str:
    if n >= MAX_LOOPS:
        raise SentenceError(f"a stage of more than {MAX_LOOPS} loops has no sentence")
    return f"L{n}"


def op_tokens(op: OpModel) -> list[str]:
    """The operator, completely and independently of the names its author chose (`op_source` inverts it)."""
    ids = tensor_ids(op)
    out = ["OP"]
    for t in op.inputs:
        out += ["IN", _tensor(ids[t.name]), t.dtype, "["] + [x for d in t.shape for x in int_tokens(d)] + ["]"]
    for st in op.stages:
        loops = {ix.name: n for n, ix in enumerate(st.loops)}
        out += ["STAGE", _tensor(ids[st.tensor]), st.dtype, "["]
        out += [x for ix in st.spatial for x in int_tokens(ix.extent)] + ["]"]
        for ix in st.reduce:
            out += ["R"] + int_tokens(ix.extent)
        out += [st.ast.op] + _expr(st.ast.rhs, loops, ids)
    return out + ["OUT"] + [_tensor(ids[t.name]) for t in op.outputs]


def _expr(e, loops: dict, ids: dict) -> list[str]:
    e = A.strip_parens(e)
    if isinstance(e, A.Num):
        return float_tokens(e.value) if e.is_float else int_tokens(e.value)
    if isinstance(e, A.Var):
        return [_loop(loops[e.name])]
    if isinstance(e, A.Access):
        out = [_tensor(ids[e.tensor]), "["]
        for n, idx in enumerate(e.indices):
            out += ([","] if n else []) + _index(idx, loops, ids)
        return out + ["]"]
    if isinstance(e, A.Call):
        head = f"fn:{e.func}" if e.func in FUNCTIONS else f"cast:{e.func}"
        return [head] + [t for a in e.args for t in _expr(a, loops, ids)]
    if isinstance(e, A.BinOp):
        return [e.op] + _expr(e.left, loops, ids) + _expr(e.right, loops, ids)
    if isinstance(e, A.Neg):
        return ["neg"] + _expr(e.operand, loops, ids)
    if isinstance(e, A.Not):
        return ["not"] + _expr(e.operand, loops, ids)
    if isinstance(e, A.Compare):  # a < b < c is a < b and b < c (Python's chain, which the language follows)
        pairs = [[op] + _expr(a, loops, ids) + _expr(b, loops, ids)
                 for op, a, b in zip(e.ops, e.operands, e.operands[1:])]
        return ["and"] * (len(pairs) - 1) + [t for p in pairs for t in p]
    if isinstance(e, A.BoolOp):  # n-ary -> left-nested binary
        return [e.op] * (len(e.values) - 1) + [t for v in e.values for t in _expr(v, loops, ids)]
    if isinstance(e, A.IfExp):
        return ["if"] + _expr(e.cond, loops, ids) + _expr(e.then, loops, ids) + _expr(e.orelse, loops, ids)
    raise SentenceError(f"no sentence form for {type(e).__name__}")


def _affine(e, loops: dict):
    """{loop id: coefficient}, constant -- or None when `e` is not affine in the loops."""
    e = A.strip_parens(e)
    if isinstance(e, A.Num):
        return ({}, e.value) if not e.is_float else None
    if isinstance(e, A.Var):
        return {loops[e.name]: 1}, 0
    if isinstance(e, A.Neg):
        inner = _affine(e.operand, loops)
        return None if inner is None else ({k: -c for k, c in inner[0].items()}, -inner[1])
    if isinstance(e, A.BinOp) and e.op in "+-*" and len(e.op) == 1:
        a, b = _affine(e.left, loops), _affine(e.right, loops)
        if a is None or b is None:
            return None
        if e.op == "*":
            if a[0] and b[0]:
                return None  # a product of loops
            (terms, c), k = (a, b[1]) if a[0] else (b, a[1])
            return {i: v * k for i, v in terms.items()}, c * k
        sign = 1 if e.op == "+" else -1
        terms = dict(a[0])
        for i, v in b[0].items():
            terms[i] = terms.get(i, 0) + sign * v
        return terms, a[1] + sign * b[1]
    return None


def _index(idx, loops: dict, ids: dict) -> list[str]:
    bare = A.strip_parens(idx)
    if isinstance(bare, A.Var):
        return [_loop(loops[bare.name])]
    form = _affine(idx, loops)
    if form is None:
        return ["~"] + _expr(idx, loops, ids)
    terms = sorted((i, c) for i, c in form[0].items() if c)
    const = form[1]
    out: list[str] = []
    for i, c in terms:
        out += (["-"] if c < 0 else ["+"] if out else []) + [_loop(i)] + (["*"] + int_tokens(abs(c)) if abs(c) != 1 else [])
    # `i + 0` stays apart from `i`: only a bare index gives its loop an extent (docs §3, extents)
    if const or not out or (len(terms) == 1 and terms[0][1] == 1):
        out += (["-"] if const < 0 else ["+"] if out else []) + int_tokens(abs(const))
    return out


# -------------------------------------------------- the operator, rebuilt
class _Reader:
    def __init__(self, tokens: list[str], i: int = 0):
        self.t, self.i = tokens, i

    def peek(self) -> str:
        return self.t[self.i] if self.i < len(self.t) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if want is not None and tok != want:
            raise SentenceError(f"expected {want!r} at token {self.i}, got {tok!r}")
        self.i += 1
        return tok

    def int(self) -> int:
        value, self.i = read_int(self.t, self.i)
        return value


def _names(tok: str, kind: str) -> str:
    if not (tok[:1] == kind and tok[1:].isdigit()):
        raise SentenceError(f"expected a {'tensor' if kind == 't' else 'loop'} id, got {tok!r}")
    return tok


def op_source(tokens: list[str], name: str = "op") -> str:
    """The .tsched text of the operator a prompt describes (tensors t0.., indices L0..), from the prompt
    alone: `OP ... OUT t..` (a whole prompt is accepted; what comes before OP is skipped)."""
    r = _Reader(tokens, tokens.index("OP") + 1)
    inputs, shapes, dtypes, stages, outputs = [], {}, {}, [], []
    while r.peek() == "IN":
        r.take()
        t = _names(r.take(), "t")
        dtypes[t] = r.take()
        shapes[t] = _shape(r)
        inputs.append(t)
    while r.peek() == "STAGE":
        r.take()
        t = _names(r.take(), "t")
        dtypes[t] = r.take()
        shapes[t] = _shape(r)
        reduce = []
        while r.peek() == "R":
            r.take()
            reduce.append(r.int())
        op = r.take()
        if op not in ("=", "+=", "max=", "min="):
            raise SentenceError(f"expected a stage operator, got {op!r}")
        rhs = _read_expr(r)
        lhs = ", ".join(f"L{n}" for n in range(len(shapes[t])))
        stages.append((t, f"{t}[{lhs}] {op} {rhs}"))
    r.take("OUT")
    while r.peek().startswith("t") and r.peek()[1:].isdigit():
        outputs.append(r.take())

    def decl(t):
        return f"{t}: {dtypes[t]}[{', '.join(map(str, shapes[t]))}]"
    outs = ", ".join(decl(t) for t in outputs)
    lines = [f"op {name}({', '.join(decl(t) for t in inputs)}) -> {outs if len(outputs) == 1 else f'({outs})'} {{"]
    for t, text in stages:
        if t not in outputs:  # every intermediate declared: its dtype and shape are the prompt's
            lines.append(f"    {decl(t)}")
        lines.append(f"    {text}")
    return "\n".join(lines + ["}"]) + "\n"


def _shape(r: _Reader) -> list[int]:
    r.take("[")
    dims = []
    while r.peek() != "]":
        dims.append(r.int())
    r.take("]")
    return dims


_FLOAT_WORDS = {_float_word(v) for v in FLOAT_TABLE}
_BINARY = {"+", "-", "*", "/", "//", "%", "**", "<", "<=", ">", ">=", "==", "!=", "and", "or"}


# Binding strength of each form in .tsched (docs §3, expressions): parentheses only where needed, so the
# rebuilt text has the shape of its source (the reference interpreter picks its contraction path by it).
_PREC = {"if": 1, "or": 2, "and": 3, "not": 4, "<": 5, "<=": 5, ">": 5, ">=": 5, "==": 5, "!=": 5, "+": 6, "-": 6,
         "*": 7, "/": 7, "//": 7, "%": 7, "neg": 8, "**": 9}
_ATOM = 10


def _read_expr(r: _Reader) -> str:
    """A prefix expression -> .tsched text."""
    return _read(r)[0]


def _wrap(part: tuple[str, int], need: int) -> str:
    text, prec = part
    return text if prec >= need else f"({text})"


def _read(r: _Reader) -> tuple[str, int]:
    """(text, binding strength) of the prefix expression at r."""
    tok = r.peek()
    if tok in _BINARY:
        r.take()
        a, b = _read(r), _read(r)
        p = _PREC[tok]
        if tok == "**":  # right-associative; `-a ** b` is -(a ** b), `a ** -b` is allowed
            return f"{_wrap(a, _ATOM)} ** {_wrap(b, _PREC['neg'])}", p
        if p == 5:  # no chains: a comparison's operands are arithmetic
            return f"{_wrap(a, 6)} {tok} {_wrap(b, 6)}", p
        return f"{_wrap(a, p)} {tok} {_wrap(b, p + 1)}", p  # left-associative
    if tok == "neg":
        r.take()
        return f"-{_wrap(_read(r), _PREC['neg'])}", _PREC["neg"]
    if tok == "not":
        r.take()
        return f"not {_wrap(_read(r), _PREC['not'])}", _PREC["not"]
    if tok == "if":  # `then if cond else orelse`: then and cond are or-level, orelse may be a conditional
        r.take()
        cond, then, orelse = _read(r), _read(r), _read(r)
        return f"{_wrap(then, 2)} if {_wrap(cond, 2)} else {_wrap(orelse, 1)}", 1
    if tok.startswith(("fn:", "cast:")):
        r.take()
        func = tok.split(":", 1)[1]
        n = FUNCTIONS.get(func, 1)
        return f"{func}({', '.join(_read(r)[0] for _ in range(n))})", _ATOM
    if tok == "FLT":
        r.take()
        m, e = r.int(), r.int()
        v = float(f"{m}e{e}")
        return repr(v), _ATOM if v >= 0 else _PREC["neg"]
    if tok.startswith("t") and tok[1:].isdigit():
        r.take()
        r.take("[")
        idx = []
        while r.peek() != "]":
            if idx:
                r.take(",")
            idx.append(_read_index(r))
        r.take("]")
        return f"{tok}[{', '.join(idx)}]", _ATOM
    if tok.startswith("L") and tok[1:].isdigit():
        return r.take(), _ATOM
    if tok in _FLOAT_WORDS:
        r.take()
        return repr(float(tok)), _ATOM
    if tok == "NUM>" or tok.lstrip("-").isdigit():
        v = r.int()
        return str(v), _ATOM if v >= 0 else _PREC["neg"]
    raise SentenceError(f"unexpected token {tok!r} in an expression")


def _read_index(r: _Reader) -> str:
    if r.peek() == "~":
        r.take()
        return _read_expr(r)
    parts = []
    while r.peek() not in (",", "]"):
        tok = r.peek()
        if tok in ("+", "-", "*"):
            parts.append(r.take())
        elif tok.startswith("L") and tok[1:].isdigit():
            parts.append(r.take())
        else:
            parts.append(str(r.int()))
    text = " ".join(parts)
    return "-" + text[2:] if text.startswith("- ") else text


def rebuild_op(tokens: list[str], name: str = "op"):
    """The OpModel of the operator a prompt describes (checked like any source)."""
    from tensorlang import api
    doc = api.load_text(op_source(tokens, name), "<prompt>")
    if name not in doc.model.ops:
        raise SentenceError(f"the prompt's operator does not check: {[d.message for d in doc.diagnostics][:3]}")
    return doc.model.ops[name]


def prompt_tokens(space: Space) -> list[str]:
    return version_tokens() + target_tokens(space.target) + op_tokens(space.op)


# --------------------------------------------------- what decisions are about
@dataclass
class _SketchFacts:
    """What a sketch's trace says about its decisions, per decision index: the block a tile's loop was
    got from, and a categorical's head (its meaning and subject)."""
    tile_blocks: dict
    categorical_heads: dict
    kinds: tuple  # per decision: tile | categorical | location


_INERT = {("UNROLL",), ("UNROLL_IMPLICIT",), ("UNUSED",)}  # categoricals that only annotate (or nothing)


def shape_key(space: Space, sketch: int, decisions) -> tuple:
    """What a compute-at decision's sites depend on, of the decisions before it: the earlier sites, which
    tile factors are 1 (TVM skips unit loops), the categoricals that shape loops -- not the other factors
    (loop extents) nor unroll steps. A decoder's later schedules of one operator meet each compute-at
    decision under a few such keys, and NextTokens answers them without a replay (checked against the
    replay whenever one runs, and in tests against replays of sampled points of every workload) --
    except a decision whose consumer reads the block through non-affine indices (SiteRule.affine), whose
    sites depend on the factors' values too: it is never remembered by its key."""
    facts = _facts(space, sketch)
    out = []
    for k, v in enumerate(decisions):
        kind = facts.kinds[k]
        if kind == TILE:
            out.append(tuple(f == 1 for f in v))
        elif kind == CATEGORICAL and facts.categorical_heads.get(k) in _INERT:
            out.append(None)
        else:
            out.append(v)
    return (sketch, tuple(out))


_INFO: "weakref.WeakKeyDictionary[Space, dict]" = weakref.WeakKeyDictionary()


def _info(space: Space) -> dict:
    info = _INFO.get(space)
    if info is None:
        info = _INFO[space] = {"ids": tensor_ids(space.op), "facts": {}, "shapes": {}, "sites": {},
                               "lock": threading.Lock()}
    return info


def block_tokens(name: str, ids: dict) -> list[str]:
    """A block: its tensor's id, then the words TVM added to a block it made (`A_shared` -> t0 shared)."""
    if name == "root":
        return ["root"]
    if name in ids:
        return [_tensor(ids[name])]
    base = max((t for t in ids if name.startswith(t + "_")), key=len, default=None)
    if base is None:
        return ["block?"]
    words = name[len(base) + 1:].split("_")
    return [_tensor(ids[base])] + [t for w in words for t in (int_tokens(int(w)) if w.isdigit() else
                                                            [w if w in _BLOCK_WORDS else "word?"])]


def _facts(space: Space, sketch: int) -> _SketchFacts:
    info = _info(space)
    facts = info["facts"].get(sketch)
    if facts is not None:
        return facts
    design, ids = space.designs[sketch], info["ids"]
    producer, users, order = {}, {}, []
    for inst in space.sketches[sketch].insts:
        kind = inst.kind.name
        if kind == "EnterPostproc":
            break
        for rv in inst.inputs:
            users.setdefault(rv, []).append(inst)
        for n, rv in enumerate(inst.outputs):
            producer[rv] = (inst, n)
        if kind in ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation"):
            order.append(inst)

    def block_name(rv) -> str:
        try:
            return design.get(rv).name_hint
        except Exception:  # the block is gone from the design's final state (inlined): the trace names it
            inst = producer.get(rv, (None,))[0]
            return str(inst.attrs[0]) if inst is not None and inst.kind.name == "GetSBlock" else "?"

    def loop_words(rv) -> list[str]:
        """A loop variable as the trace made it: the i-th loop GetLoops gave, a part of a split, a fusion."""
        inst, n = producer.get(rv, (None, 0))
        kind = inst.kind.name if inst is not None else ""
        if kind == "GetLoops":
            return [_loop(n)]
        if kind == "Split":
            return loop_words(inst.inputs[0]) + [f".{min(n, MAX_PARTS - 1)}"]
        if kind == "Fuse":
            words = [loop_words(x) for x in inst.inputs]
            return [t for n, w in enumerate(words) for t in (["&"] if n else []) + w]
        return ["free"]

    def loop_block(rv):
        inst = producer.get(rv, (None,))[0]
        while inst is not None and inst.kind.name in ("Split", "Fuse"):
            inst = producer.get(inst.inputs[0], (None,))[0]
        return inst.inputs[0] if inst is not None and inst.kind.name == "GetLoops" else None

    tiles, heads = {}, {}
    for k, inst in enumerate(order):
        kind = inst.kind.name
        if kind == "SamplePerfectTile":
            b = loop_block(inst.inputs[0])
            tiles[k] = block_name(b) if b is not None else ""
        elif kind == "SampleCategorical":
            # CAT: a use we have no name for; UNUSED: no instruction uses the value (CrossThreadReduction
            # samples a thread count for a second reduction and then reuses the first one's)
            heads[k] = ("CAT",) if users.get(inst.outputs[0]) else ("UNUSED",)
            for use in users.get(inst.outputs[0], ()):
                u = use.kind.name
                if u == "Annotate":
                    key = str(use.attrs[0])
                    target = block_tokens(block_name(use.inputs[0]), ids)
                    if key == "meta_schedule.unroll_explicit":
                        heads[k] = ("UNROLL",)
                    elif key == "meta_schedule.unroll_implicit":
                        heads[k] = ("UNROLL_IMPLICIT",)
                    elif key == "meta_schedule.cooperative_fetch":
                        heads[k] = ("VECTOR", *target)
                    break
                if u == "Split":  # a thread count: the factor of a loop that is then bound
                    b = loop_block(use.inputs[0])
                    where = block_tokens(block_name(b), ids) if b is not None else ["block?"]
                    heads[k] = ("THREADS", *where, *loop_words(use.inputs[0]))
                    break
    kinds = tuple({"SamplePerfectTile": TILE, "SampleCategorical": CATEGORICAL}.get(i.kind.name, LOCATION)
                  for i in order)
    facts = info["facts"][sketch] = _SketchFacts(tiles, heads, kinds)
    return facts


def _iter_users(realize, chain) -> list[list[int]]:
    """For each iterator of a block, the positions in `chain` (its loops, outermost first) of the loops
    its binding uses."""
    from tvm.tirx.analysis import undefined_vars
    out = []
    for value in realize.iter_values:
        used = undefined_vars(value, [])
        out.append([i for i, loop in enumerate(chain) if any(v.same_as(loop.loop_var) for v in used)])
    return out


def _role_words(users: list[list[int]], i: int) -> list[str]:
    """The loop at chain position i named by the iterators it runs over: L4, L4 .1 (the second of L4's
    loops), L2 & L3 (a fusion); `free` if it runs over none of them."""
    out: list[str] = []
    for j, u in enumerate(users):
        if i in u:
            out += (["&"] if out else []) + [_loop(j)] + ([f".{min(u.index(i), MAX_PARTS - 1)}"] if len(u) > 1 else [])
    return out or ["free"]


def _realize_named(loop, name: str):
    from tensorlang.lower import tir
    for realize, loops in tir.block_realizes(loop):
        if realize.block.name_hint == name:
            return realize, loops
    return None, ()


def tile_head(space: Space, sketch: int, k: int, point: DecisionPoint) -> tuple:
    """TILE <block> <loop> <n>: the block the sketch tiles, and which of its iterators the loop runs over."""
    cached = point.cache.get("head")
    if cached is not None:
        return cached
    ids = _info(space)["ids"]
    name = _facts(space, sketch).tile_blocks.get(k, "")
    realize, below = _realize_named(point.loop, name) if point.loop is not None else (None, ())
    if realize is None:
        words = ["free"]
    else:
        chain = list(point.outer) + list(below)
        words = _role_words(_iter_users(realize, chain), len(point.outer))
    head = ("TILE", *block_tokens(name, ids), *words, *int_tokens(point.n))
    point.cache["head"] = head
    return head


def site_values(space: Space, point: DecisionPoint) -> list[tuple[tuple, int]]:
    """(tokens, site) for each site of a compute-at decision: inline, root, or the consumer's loop as
    `<block> <loop>` -- the block being the consumer, or for a loop the consumer does not run over, the
    first block under it that does."""
    cached = point.cache.get("sites")
    if cached is not None:
        return cached
    ids = _info(space)["ids"]
    chain = list(point.consumer_loops)
    users = consumer_users(point) or []
    out = []
    for d in point.domain:
        if d < 0:
            out.append((("inline",) if d == -2 else ("root",), d))
            continue
        words, block = _role_words(users, d), point.consumer
        if words == ["free"]:  # an outer loop the consumer is nested in, not one it iterates
            from tensorlang.lower import tir
            for r, loops in tir.block_realizes(chain[d]):
                if r.block.name_hint == point.consumer:
                    continue
                other = _role_words(_iter_users(r, chain[:d] + list(loops)), d)
                if other != ["free"]:
                    words, block = other, r.block.name_hint
                    break
        out.append((tuple(block_tokens(block, ids) + words), d))
    out = _distinct(out)
    point.cache["sites"] = out
    return out


def consumer_users(point: DecisionPoint) -> tuple | None:
    """A compute-at decision's consumer iterators: per iterator, the positions of the consumer loops its
    binding uses (None: the consumer is not under its loops). Computed once per point."""
    if "users" not in point.cache:
        chain = list(point.consumer_loops)
        realize = _realize_named(chain[-1], point.consumer)[0] if chain else None
        point.cache["users"] = (tuple(tuple(u) for u in _iter_users(realize, chain))
                                if realize is not None else None)
    return point.cache["users"]


def _distinct(seqs: list[tuple[tuple, object]]) -> list[tuple[tuple, object]]:
    """Token sequences made unique (and so prefix-free): a sequence two values share gets `# n` on each."""
    count: dict = {}
    for s, _ in seqs:
        count[s] = count.get(s, 0) + 1
    seen: dict = {}
    out = []
    for s, v in seqs:
        if count[s] > 1:
            n = seen[s] = seen.get(s, -1) + 1
            s = s + ("#", *int_tokens(n))
        out.append((s, v))
    return out


# ------------------------------------------------- compute-at sites derived
# A compute-at decision's sites depend on the tile factors before it only through which of its
# consumer's loops run once: TVM skips those as sites and counts them data-parallel. (Where the consumer
# reads the block through affine indices, SiteRule.affine: a grouped conv's `c // 8 * 8` makes a site's
# legality depend on whether the channel tile divides the group, and such a decision is always replayed.)
# Everything else -- which loops exist, which iterators' bindings use each (unit loops included), the kind
# of each loop that runs more than once, where compute_at is legal -- is the structure the other decisions
# (earlier sites, shaping categoricals) fix. So the replays that met a decision under one coarse key (SiteFacts,
# merged) answer it for every unit pattern whose running loops ran in one of them. Merging checks that the replays
# agree on each loop's facts (a key where they would not is never answered so); every site derived is
# checked against a full replay when the schedule is finished (NextTokens._met); tests compare them on
# sampled points of the workloads.
@dataclass
class SiteFacts:
    point: DecisionPoint  # the first replay's (the consumer, its loops' names, the sources)
    kinds: list  # per candidate loop: its iteration type when it runs more than once (None: not seen so)
    legal: list  # per candidate loop: compute_at legal there when it runs more than once
    users: tuple  # per consumer iterator: the positions of the consumer loops its binding uses
    ran: set  # positions of the consumer loops seen running more than once
    consistent: bool = True

    @staticmethod
    def of(point: DecisionPoint) -> SiteFacts | None:
        if (point.kind != LOCATION or point.rule is None or not point.rule.affine or point.sources is None
                or not point.consumer_loops):  # not affine: a site's legality depends on the factors' values
            return None
        n = len(point.rule.kinds)
        facts = SiteFacts(point, [None] * n, [None] * n, (), set())
        return facts if facts.merge(point) else None

    def merge(self, point: DecisionPoint) -> bool:
        """Add what a replay of the decision saw; False (and never answering again) where it disagrees."""
        if not self.consistent:
            return False
        rule, chain = point.rule, list(point.consumer_loops)
        users = consumer_users(point)
        if (users is None or point.sources != self.point.sources or rule.inline != self.point.rule.inline
                or len(rule.kinds) != len(self.kinds)):
            self.consistent = False
            return False
        if self.users and users != self.users:
            self.consistent = False
            return False
        self.users = users
        for i, src in enumerate(self.point.sources):
            # a loop not split by a tile of this sketch is taken to run as the first replay saw it
            # (derive reads it from that replay): a replay that saw otherwise ends the answering
            if src[0] != "tile" and i < len(chain) and runs_once(chain[i]) != runs_once(self.point.consumer_loops[i]):
                self.consistent = False
                return False
        for i, loop in enumerate(chain):
            if runs_once(loop):
                continue
            self.ran.add(i)
            if i < len(self.kinds):
                for mine, theirs in ((self.kinds, rule.kinds[i]), (self.legal, rule.legal[i])):
                    if theirs is None:  # not asked by that replay (the rule stopped before it)
                        continue
                    if mine[i] is not None and mine[i] != theirs:
                        self.consistent = False
                    mine[i] = theirs
        return self.consistent

    def derive(self, space: Space, decisions) -> DecisionPoint | None:
        """The decision after `decisions` (a prefix under this coarse key): its domain and site tokens --
        or None when these facts cannot tell (a loop runs now that no replay saw running, or a site's
        words would need another block's bindings)."""
        if not self.consistent:
            return None
        t = self.point
        units = []
        for i, src in enumerate(t.sources):
            unit = decisions[src[1]][src[2]] == 1 if src[0] == "tile" else runs_once(t.consumer_loops[i])
            if not unit and i not in self.ran:
                return None
            units.append(unit)
        n = len(self.kinds)
        kinds = tuple("datapar" if units[i] else self.kinds[i] for i in range(n))

        def legal(i: int) -> bool:
            if self.legal[i] is None:  # no replay asked TVM about this loop
                raise _Unknown()
            return self.legal[i]
        try:
            domain = candidate_sites(t.rule.inline, kinds, units[:n], legal)
        except _Unknown:
            return None
        users = [list(u) for u in self.users]
        ids = _info(space)["ids"]
        out = []
        for d in domain:
            if d < 0:
                out.append((("inline",) if d == -2 else ("root",), d))
                continue
            words = _role_words(users, d)
            if words == ["free"]:
                return None
            out.append((tuple(block_tokens(t.consumer, ids) + words), d))
        sites = tuple(t.consumer_loops[d].loop_var.name if d >= 0 else "" for d in domain)
        return replace(t, domain=domain, sites=sites, cache={"sites": _distinct(out), "users": self.users})


class _Unknown(Exception):
    pass


def coarse_key(space: Space, sketch: int, decisions) -> tuple:
    """shape_key without the tile factors (their unit patterns are SiteFacts' business)."""
    kinds = _facts(space, sketch).kinds
    return (sketch, tuple(None if kinds[k] == TILE else v for k, v in enumerate(shape_key(space, sketch, decisions)[1])))


def remember_sites(space: Space, sketch: int, decisions, point: DecisionPoint, widen: bool = True) -> None:
    """What a replay saw of a compute-at decision, merged into its coarse key's facts. When that replay
    left loops running once that a tile could make run more (widen), the decision is also replayed, in
    the background, with the widest tiles and every loop's legality asked: then the next unit patterns
    are answered without a replay."""
    info = _info(space)
    key = coarse_key(space, sketch, decisions)
    with info["lock"]:
        facts = info["sites"].get(key)
        if facts is not None:
            facts.merge(point)
            return
        facts = SiteFacts.of(point)
        if facts is None:
            return
        info["sites"][key] = facts
    if widen and any(src[0] == "tile" and i not in facts.ran for i, src in enumerate(facts.point.sources)):
        _Widener.of(space).put(_widen(sketch, tuple(decisions), True))


def warm_sketch(space: Space, sketch: int, static: list) -> None:
    """For an eager decoder that has just chosen a sketch, in the background (the decoder's model steps give it
    the time): the heads of the sketch's static decisions (_heads), and its first compute-at decision --
    when only tiles and inert categoricals come before it, so that every prefix has one coarse key --
    replayed with tiles that make every loop run and every loop's legality asked (remember_sites'
    widening), so that its sites are derived when the decoder gets there. The first time, a conv2d's pad
    has ~20 loops to probe (8-12 ms, two model steps); the tile decisions before it give dozens."""
    info = _info(space)
    with info["lock"]:  # once per sketch: what follows is not for every sentence a decoder starts
        warmed = info.setdefault("warmed", set())
        if sketch in warmed:
            return
        warmed.add(sketch)
    _Widener.of(space).put(_heads(sketch, static))
    facts = _facts(space, sketch)
    if LOCATION not in facts.kinds:
        return
    k = facts.kinds.index(LOCATION)
    domains = []
    for j in range(k):
        point = static[j] if j < len(static) else None
        if point is None:
            return
        if facts.kinds[j] == TILE:
            domains.append(point.domain)
        elif facts.categorical_heads.get(j) in _INERT:
            domains.append((point.domain[0],))
        else:  # a categorical that shapes loops: the decoder's value decides the key
            return
    prefixes = _covering(domains)
    with info["lock"]:
        if coarse_key(space, sketch, prefixes[0]) in info["sites"]:  # a replay has told them already
            return
    for prefix in prefixes:
        _Widener.of(space).put(_widen(sketch, prefix, False))


def _covering(domains: list) -> list[tuple]:
    """A few choices of every decision (one value of each domain per prefix) such that each part of each
    tile that can exceed 1 does in at least one of them: the widest tile alone leaves a prime extent's
    outer part (3 = 1 x 3) never running. A non-tile domain here holds the one value to take."""
    need = {(j, m) for j, dom in enumerate(domains) for f in dom if isinstance(f, tuple)
            for m, x in enumerate(f) if x > 1}
    out = []
    while need or not out:
        prefix = []
        for j, dom in enumerate(domains):
            best = max(dom, key=lambda f: sum((j, m) in need for m, x in enumerate(f) if x > 1)
                       if isinstance(f, tuple) else 0)
            prefix.append(best)
        covered = {(j, m) for j, f in enumerate(prefix) if isinstance(f, tuple) for m, x in enumerate(f) if x > 1}
        if out and not covered & need:
            break
        need -= covered
        out.append(tuple(prefix))
    return out


def derived_point(space: Space, sketch: int, decisions) -> DecisionPoint | None:
    info = _info(space)
    with info["lock"]:
        facts = info["sites"].get(coarse_key(space, sketch, decisions))
        return facts.derive(space, decisions) if facts is not None else None


def _widest(domain) -> tuple:
    """The factorization with the most factors above 1 (the first such)."""
    return max(domain, key=lambda f: sum(x > 1 for x in f))


class _Widener:
    """A space's background work for decoders: replays of compute-at decisions with the widest tiles
    (remember_sites, warm_sketch) and the heads of a chosen sketch's decisions. A job is a function of the
    space. It holds the space weakly and ends when the space is gone or nothing has been asked for a while
    (a job put just as it ends is dropped: this work only saves later steps, it decides nothing)."""

    def __init__(self, space: Space):
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(weakref.ref(space), self.jobs), daemon=True)
        self.thread.start()

    @staticmethod
    def of(space: Space) -> "_Widener":
        info = _info(space)
        with info["lock"]:
            w = info.get("widener")
            if w is None or not w.thread.is_alive():
                w = info["widener"] = _Widener(space)
            return w

    def put(self, job: Callable[[Space], None]) -> None:
        self.jobs.put(job)

    @staticmethod
    def _run(space_ref, jobs: queue.Queue) -> None:
        while True:
            try:
                job = jobs.get(timeout=10)
            except queue.Empty:
                return
            space = space_ref()
            if space is None:
                return
            try:
                job(space)
            except Exception:  # _Stopped, or the widened tiles made the schedule refuse an earlier value
                pass
            finally:
                jobs.task_done()  # (jobs.join() waits for the work asked so far)
            del space


def _widen(sketch: int, decisions: tuple, widest: bool) -> Callable[[Space], None]:
    """A job: replay the sketch up to the compute-at decision after `decisions`, every loop's legality
    asked, and remember its sites; `widest`: each tile on the way its widest factorization instead."""
    k = len(decisions)

    def job(space: Space) -> None:
        def choose(point, prefix):
            if len(prefix) == k:
                remember_sites(space, sketch, decisions, point, widen=False)
                raise _Stopped()
            if point.kind == TILE and widest:
                return _widest(point.domain)
            if decisions[len(prefix)] not in point.domain:
                raise _Stopped()
            return decisions[len(prefix)]
        space.replay(sketch, choose, convert=False, probe_all=True)
    return job


def _heads(sketch: int, static: list) -> Callable[[Space], None]:
    """A job: the heads of a sketch's static decisions after the first (a tile's head names its loop by walking
    the block's bindings: 0.2-1 ms each the first time), cached in their points before a decoder asks."""
    def job(space: Space) -> None:
        for k, point in enumerate(static):
            if k and point is not None:
                decision_head(space, sketch, k, point)
    return job


def categorical_values(point: DecisionPoint) -> list[tuple[tuple, int]]:
    """(tokens, index) per legal candidate: the candidate's value, not its index."""
    return _distinct([(tuple(int_tokens(int(point.candidates[i]))), i) for i in point.domain])


def decision_head(space: Space, sketch: int, k: int, point: DecisionPoint) -> tuple:
    if point.kind == TILE:
        return tile_head(space, sketch, k, point)
    if point.kind == CATEGORICAL:
        return _facts(space, sketch).categorical_heads.get(k, ("CAT",))
    return ("LOC", *block_tokens(point.placed, _info(space)["ids"]))


def is_loop_word(t: str) -> bool:
    """A word of a loop's name in a decision: `L4`, `.1`, `&`, `free`."""
    return (t[:1] in ("L", ".") and t[1:].isdigit()) or t in ("&", "free")


def tile_value_tokens(factors) -> list[str]:
    """`= <extent>`, then the factors innermost first, each but the last chosen followed by `= <what is
    left to split>` (the outermost factor is what is left: it is forced)."""
    left = math.prod(factors)
    out = ["="] + int_tokens(left)
    for i, f in enumerate(reversed(factors)):
        out += int_tokens(f)
        left //= f
        if i + 1 < len(factors):
            out += ["="] + int_tokens(left)
    return out


def value_tokens(space: Space, point: DecisionPoint, value) -> list[str]:
    if point.kind == TILE:
        return tile_value_tokens(value)
    seqs = categorical_values(point) if point.kind == CATEGORICAL else site_values(space, point)
    for s, v in seqs:
        if v == value:
            return list(s)
    raise SentenceError(f"{value!r} is not in the domain of {point.subject}")


# ------------------------------------------------------------ encode / decode
def decision_points(space: Space, sketch: int, decisions) -> list[DecisionPoint]:
    """The decision points a decoder meets for these decisions (the same objects NextTokens uses: the
    sketch's static table, the space's memo, else one replay), each checked to hold its value."""
    static = space.static_points(sketch)
    if len(decisions) != len(static):
        raise SentenceError(f"sketch {sketch} makes {len(static)} decisions, not {len(decisions)}")
    gpu = space.gpu_models[sketch]
    points: list = []
    for k in range(len(static)):
        p = static[k] or space.point_memo.get((sketch, tuple(decisions[:k])))
        if p is None:
            break
        points.append(p)
    if len(points) < len(static):  # some point only a replay gives
        live: list = []
        space._apply(sketch, lambda p, made: (live.append(p), decisions[len(made)])[1], gpu)
        points = [static[k] or live[k] for k in range(len(static))]
    out = []
    for k, (p, value) in enumerate(zip(points, decisions)):
        if gpu is not None and p.kind == TILE:
            p = replace(p, domain=gpu.restrict(k, p.domain, tuple(decisions[:k])), cache={})
        if value not in p.domain:
            raise SentenceError(f"decision {k} ({value!r}) is not in the domain of {p.subject}")
        out.append(p)
    return out


def encode(space: Space, point: Point, kinds: list[str] | None = None) -> list[str]:
    """The whole sentence of a point (`kinds` is accepted for v1 callers and not needed)."""
    if point.sketch not in space.usable:
        raise SentenceError(f"sketch {point.sketch} is not usable: {space.excluded.get(point.sketch, '')}")
    out = prompt_tokens(space) + ["SKETCH"] + int_tokens(point.sketch) + ["DECISIONS"]
    for k, (p, value) in enumerate(zip(decision_points(space, point.sketch, point.decisions), point.decisions)):
        out += list(_head_of(space, point.sketch, k, p)) + value_tokens(space, p, value)
    return out + [EOS]


def _head_of(space, sketch, k, p):
    # a GPU-restricted copy of a static tile point has an empty cache: name it from the static point
    static = space.static_points(sketch)[k]
    return decision_head(space, sketch, k, static if static is not None and p.kind == TILE else p)


def decision_kinds(space: Space, point: Point) -> list[str]:
    return [p.kind for p in decision_points(space, point.sketch, point.decisions)]


def decode(space: Space, tokens: list[str]) -> tuple[int, tuple]:
    """(sketch, decisions) of a sentence for this space; refuses sentences of another version or prompt."""
    want = prompt_tokens(space)
    if tokens[:4] != want[:4]:
        raise SentenceError(f"sentence made under {' '.join(tokens[:4])}; this space is {' '.join(want[:4])}")
    if tokens[:len(want)] != want:
        raise SentenceError("the sentence's target or operator differs from this space's")
    return decode_schedule(space, tokens[len(want):])


def push_forced(decoder) -> list[str]:
    """Push every token that has a single legal choice from the decoder's state (a NextTokens, or anything
    with its `done` / `allowed()` / `push()`: the constrained decoder too); the tokens pushed, in order."""
    pushed = []
    while not decoder.done:
        allowed = decoder.allowed()
        if len(allowed) != 1:
            break
        tok = next(iter(allowed))
        decoder.push(tok)
        pushed.append(tok)
    return pushed


def decode_schedule(space: Space, tokens: list[str]) -> tuple[int, tuple]:
    """(sketch, decisions) of a sentence's schedule part (from SKETCH on) in this space, whatever its prompt
    says (a corpus check replays sentences sampled on another host against this one's space)."""
    nt = NextTokens(space)
    try:
        for tok in tokens:
            if tok not in nt.allowed():
                raise SentenceError(f"token {tok!r} is not legal here; legal: {sorted(nt.allowed())[:20]}")
            nt.push(tok)
        if not nt.done:
            raise SentenceError("the sentence ends before its last decision")
        return nt.sketch, tuple(nt.decisions)
    finally:
        nt.close()


def split(tokens: list[str]) -> tuple[list[str], list[str]]:
    """(prompt, schedule part) of a sentence."""
    i = tokens.index("SKETCH")
    return tokens[:i], tokens[i:]


# ------------------------------------------------------------- next tokens
OPEN = object()  # a decision whose value the tokens written so far do not fix yet


class _Choice:
    """Narrowing a set of token sequences, one token at a time (prefix-free: one completes)."""

    def __init__(self, seqs: list[tuple[tuple, object]]):
        self.seqs, self.pos = seqs, 0

    def allowed(self) -> set[str]:
        return {s[self.pos] for s, _ in self.seqs}

    def push(self, tok: str):
        self.seqs = [(s, v) for s, v in self.seqs if s[self.pos] == tok]
        self.pos += 1
        done = [v for s, v in self.seqs if len(s) == self.pos]
        return (True, done[0]) if done else (False, None)

    def determined(self):
        """The value, once the tokens so far leave one (what is left to write is forced); else OPEN."""
        values = {v for _, v in self.seqs}
        return next(iter(values)) if len(values) == 1 else OPEN


class _TileChoice:
    """A tile's factors one token each (a factor outside INTS: NUM> s digits <NUM), narrowed factor by factor,
    innermost first (`factors` holds them in that order); before the first, `= <extent>`, and after each
    but the last, `= <what is left>` (forced: `pending`)."""

    def __init__(self, domain, n: int):
        self.cands, self.n, self.factors, self.num = list(domain), n, [], []
        self.pending = ["="] + int_tokens(math.prod(self.cands[0])) if self.cands else []

    def _at(self) -> int:
        """The position in a tile tuple of the factor chosen next (innermost first)."""
        return self.n - 1 - len(self.factors)

    def allowed(self) -> set[str]:
        if self.pending:
            return {self.pending[0]}
        k, m = self._at(), len(self.num)
        values = {f[k] for f in self.cands}
        if not m:
            return {int_tokens(v)[0] for v in values}
        return {int_tokens(v)[m] for v in values if int_tokens(v)[:m] == self.num}

    def push(self, tok: str):
        if self.pending:
            self.pending.pop(0)
            return False, None
        self.num.append(tok)
        k = self._at()
        match = [v for v in {f[k] for f in self.cands} if int_tokens(v) == self.num]
        if not match:
            return False, None
        self.factors.append(match[0])
        self.num = []
        self.cands = [f for f in self.cands if f[k] == match[0]]
        if len(self.factors) == self.n:
            return True, tuple(reversed(self.factors))
        self.pending = ["="] + int_tokens(math.prod(self.cands[0][:k]))
        return False, None

    def determined(self):
        """The tile, once the factors so far leave one (the outermost factor and the `=` are forced); else OPEN."""
        return tuple(self.cands[0]) if len(self.cands) == 1 and not self.num else OPEN


class _Replay:
    """A sketch replayed in a background thread that stops at each decision until it is given one. It
    holds no reference to its NextTokens: a decoder state that is dropped without close() is collected,
    and its finalizer stops the thread (nothing stays blocked)."""

    def __init__(self, space: Space, sketch: int, known: dict):
        self.to_replay: queue.Queue = queue.Queue()
        self.from_replay: queue.Queue = queue.Queue()
        self.fed = self.received = 0
        self.ended = False
        self.thread = threading.Thread(target=_replay_worker,
                                       args=(space, sketch, self.to_replay, self.from_replay, known), daemon=True)
        self.thread.start()

    @staticmethod
    def stop(to_replay: queue.Queue, thread: threading.Thread) -> None:
        to_replay.put(_STOP)  # harmless if the replay has ended
        if thread.is_alive() and thread is not threading.current_thread():  # a finalizer may run on it
            thread.join(timeout=5)


def _replay_worker(space: Space, sketch: int, to_replay: queue.Queue, from_replay: queue.Queue, known: dict) -> None:
    def choose(point, prefix):
        if point.kind == LOCATION:  # its tokens, computed here, off the caller's path
            site_values(space, point)
        from_replay.put(("decision", point))
        value = to_replay.get()
        if value is _STOP:
            raise _Stopped()
        return value
    try:
        from_replay.put(("end", space.replay(sketch, choose, convert=False, known=known)))
    except _Stopped:
        pass
    except Exception as e:  # e.g. postprocessors refusing a GPU point
        from_replay.put(("error", e))


def ids_of(tokens) -> set[int]:
    ids = token_ids()
    return {ids[t] for t in tokens}


def mask_of(tokens):
    """A boolean mask over the vocabulary, True at these tokens."""
    import numpy as np
    m = np.zeros(len(token_ids()), dtype=bool)
    m[list(ids_of(tokens))] = True
    return m


SWITCH_INTERVAL_S = 0.001


def _short_switch_interval() -> None:
    """An eager decoder's replays (and the work warm_sketch starts) run on threads of their own and hold the
    GIL between TVM's calls: a decoder's thread back from a model step waits for it up to the
    interpreter's switch interval, 5 ms by default -- as long as the step itself. Process-wide, and only
    ever lowered: 1 ms took conv2d's paced free-decision p95 from 2.1 to 0.95 ms in one run here, with
    the widening running beside the decoder (benchmarks/space_speed.py)."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


class NextTokens:
    """The legal next tokens of the schedule part of a sentence, one token at a time.

    A decision whose domain cannot depend on the ones before it (Space.static_points: categoricals,
    tiles of untouched loops -- narrowed by the GPU limits where the target has them) is answered at
    once from the sketch's table, and so is any decision an earlier replay met after the same decisions
    (Space.point_memo); only the other compute-at sites and, where a postprocessor could refuse, the
    end of the sentence hand the decisions made so far to a replay in a background thread and wait.

    For a decoder: `allowed_ids()` / `mask()` over the vocabulary, `forced()` (the tokens with one legal
    choice from here, to feed in one step), `fork()` (a copy at this prefix, for K samples or beams: it
    shares the space and its memo, and starts its own replay only if it needs one), `finish()` (the
    schedule, replayed in full and converted to statements) and `close()`.

    `eager` (a decoder that runs a model step after each free token): the replay runs beside it, handed
    each decision as soon as its tokens fix it (_feed_determined); choosing a sketch starts the background
    work for its decisions (warm_sketch); the interpreter's switch interval is lowered to 1 ms.
    """

    def __init__(self, space: Space, eager: bool = False):
        self.space = space
        # eager: the replay starts with the decisions and is handed each one as it is made, so that it
        # runs while the caller does something else (a model's forward step) -- for a decoder. Not the
        # default: run beside back-to-back static steps it takes the GIL from them.
        self.eager = eager
        if eager:
            _short_switch_interval()
        self.tokens: list[str] = []
        self.sketch: int | None = None
        self.decisions: list = []
        self.done = False
        self.error: Exception | None = None
        self._phase = "SKETCH"  # SKETCH, CHOOSE (the sketch index), DECISIONS, HEAD, CHOOSE, ..., EOS, DONE
        self._point: DecisionPoint | None = None
        self._head: tuple = ()
        self._pos = 0
        self._choice = None
        self._static: list = []
        self._replay: _Replay | None = None
        self._finalizer = None
        self._result: Point | None = None
        self._assumed: dict = {}  # decision index -> compute-at point answered by its shape key, to check
        self._waiting_for = -1  # in phase WAIT: the decision (or, past the last, the end) the replay computes
        self._known: dict = {}  # decision index -> its point (unrestricted), for a replay started later

    # -- the replay, started at the first decision that needs it
    def _feed(self) -> _Replay:
        """Hand the decisions made so far to the replay, started at the first need. It gets them only then,
        in one go: left running beside the static steps it would hold the GIL for up to a switch interval
        (5 ms) at every step."""
        r = self._replay
        if r is None:  # the points this state has (or, eager, will have) are not asked of TVM again
            r = self._replay = _Replay(self.space, self.sketch, self._known if self.eager else dict(self._known))
            self._finalizer = weakref.finalize(self, _Replay.stop, r.to_replay, r.thread)
        for value in self.decisions[r.fed:]:
            r.to_replay.put(value)
        r.fed = max(r.fed, len(self.decisions))  # (one more when the decision being written was fed early)
        return r

    def _feed_determined(self) -> None:
        """Eager: a decision that the tokens written so far fix goes to the replay now, not at its last token.
        Its last tokens are mostly forced (a tile's outermost factor and `= <what is left>`, a site's last
        word), and a decoder writes forced tokens without a model step: fed at the free token that fixed
        it, the replay computes the next decision's point during that token's model step instead of while
        the decoder waits for it (softmax's compute-at sites waited 2-4 ms each)."""
        r = self._replay
        if r is None or r.fed != len(self.decisions):
            return
        value = self._choice.determined()
        if value is not OPEN:
            r.to_replay.put(value)
            r.fed += 1

    def _drain(self, k: int) -> None:
        """Feed the replay and read its messages up to decision k (or its end)."""
        r = self._feed()
        while True:
            kind, payload = r.from_replay.get()
            if kind == "decision":
                r.received += 1
                self._met(r.received - 1, payload)
                if r.received == k + 1:
                    self._set_point(k, payload)
                    return
            elif kind == "end":
                self._phase, r.ended, self._result = "EOS", True, payload
                return
            else:
                self._phase, r.ended, self.error = "ERROR", True, payload
                return

    def _advance(self) -> None:
        """Move to the next decision: from the static table or the memo when it is there, else the replay."""
        k = len(self.decisions)
        point = self._static[k] if k < len(self._static) else None
        if point is None and k < len(self._static):
            point = self.space.point_memo.get((self.sketch, tuple(self.decisions)))
        if point is None and k < len(self._static):
            point = _info(self.space)["shapes"].get(shape_key(self.space, self.sketch, self.decisions))
            if point is None and _facts(self.space, self.sketch).kinds[k] == LOCATION:
                point = derived_point(self.space, self.sketch, self.decisions)
            if point is not None:
                self._assumed[k] = point
        if point is not None:
            self._set_point(k, point)
            return
        if k == len(self._static) and self.space.refusal_free(self.sketch):
            # every decision made: the point is legal (no postprocessor refuses a point of this sketch whose
            # decisions are in their domains); `finish` replays it when the schedule is wanted
            self._phase = "EOS"
            return
        # Not waited for here: `push` returns and the replay runs while the caller does something else (a
        # model's forward step); `allowed` waits for what is left of it.
        self._feed()
        self._phase, self._waiting_for = "WAIT", k

    def _met(self, k: int, point: DecisionPoint) -> None:
        """A point the replay reached: remembered by its shape key (compute-at sites), and compared with
        the one answered by that key, if any -- a difference would be a decoding that was not exact."""
        if point.kind != LOCATION:
            return
        assumed = self._assumed.get(k)
        if assumed is point:  # handed to the replay as known: not a check (finish() replays without it)
            return
        if point.rule is None or point.rule.affine:  # else its sites depend on the factors' values too
            _info(self.space)["shapes"].setdefault(shape_key(self.space, self.sketch, self.decisions[:k]), point)
        remember_sites(self.space, self.sketch, self.decisions[:k], point)
        if assumed is None:
            return
        del self._assumed[k]
        said, real = site_values(self.space, assumed), site_values(self.space, point)
        if (assumed.domain, said) != (point.domain, real):
            # Answered wrongly (remember_sites above has told the facts, which stop answering). When the
            # site already written is one of the replay's, with the same words, the sentence is still
            # exact and the schedule legal: only that decision's offered sites were off.
            made = self.decisions[k] if k < len(self.decisions) else None
            said, real = {v: t for t, v in said}, {v: t for t, v in real}
            if made is None or made not in real or said.get(made) != real[made]:
                raise SentenceError(f"compute-at decision {k} of sketch {self.sketch}: the sites answered by "
                                    f"its shape {assumed.domain} differ from the replay's {point.domain}")

    def _set_point(self, k: int, point: DecisionPoint) -> None:
        self._known[k] = point
        head = decision_head(self.space, self.sketch, k, point)
        gpu = self.space.gpu_models[self.sketch]
        if gpu is not None and point.kind == TILE:
            point = replace(point, domain=gpu.restrict(k, point.domain, tuple(self.decisions)), cache={})
        self._point, self._head, self._pos, self._phase = point, head, 0, "HEAD"
        if point.kind == TILE:
            self._choice = _TileChoice(point.domain, point.n)
        elif point.kind == CATEGORICAL:
            self._choice = _Choice(categorical_values(point))
        else:
            self._choice = _Choice(site_values(self.space, point))

    # -- the API
    def allowed(self) -> set[str]:
        if self._phase == "WAIT":
            self._drain(self._waiting_for)
        s = self._phase
        if s == "SKETCH":
            return {"SKETCH"}
        if s == "DECISIONS":
            return {"DECISIONS"}
        if s == "HEAD":
            return {self._head[self._pos]}
        if s == "CHOOSE":
            return self._choice.allowed()
        if s == "EOS":
            return {EOS}
        return set()

    def allowed_ids(self) -> set[int]:
        return ids_of(self.allowed())

    def mask(self):
        """A boolean mask over the vocabulary: True for the legal next tokens."""
        return mask_of(self.allowed())

    def forced(self) -> list[str]:
        """The tokens that have a single legal choice from here, in order (a decoder feeds them in one step;
        a compute-at site may need the replay to know). This state is left as it is (a fork is probed)."""
        probe = self.fork()
        try:
            return push_forced(probe)
        finally:
            probe.close()

    def push(self, tok: str) -> None:
        if tok not in self.allowed():
            raise SentenceError(f"token {tok!r} is not legal here")
        self.tokens.append(tok)
        s = self._phase
        if s == "SKETCH":
            self._phase, self._point = "CHOOSE", None
            self._choice = _Choice([(tuple(int_tokens(k)), k) for k in self.space.usable])
        elif s == "DECISIONS":
            self._static = self.space.static_points(self.sketch)
            if self.eager and (None in self._static or not self.space.refusal_free(self.sketch)):
                self._feed()
            if self.eager:
                warm_sketch(self.space, self.sketch, self._static)
            self._advance()
        elif s == "HEAD":
            self._pos += 1
            if self._pos == len(self._head):
                self._phase = "CHOOSE"
        elif s == "CHOOSE":
            complete, value = self._choice.push(tok)
            if not complete:
                if self.eager and self._point is not None:
                    self._feed_determined()
                return
            if self._point is None:  # the sketch index
                self.sketch, self._phase = value, "DECISIONS"
                return
            self.decisions.append(value)
            if self._replay is not None and self.eager:
                self._feed()
            self._advance()
        elif s == "EOS":
            self.done, self._phase = True, "DONE"

    @property
    def free(self) -> bool:
        """More than one legal next token."""
        return len(self.allowed()) > 1

    def fork(self) -> "NextTokens":
        """A copy at this prefix that goes on independently (for K samples or beams)."""
        other = NextTokens(self.space, self.eager)
        other.tokens, other.sketch, other.decisions = list(self.tokens), self.sketch, list(self.decisions)
        other.done, other.error, other._phase, other._waiting_for = self.done, self.error, self._phase, self._waiting_for
        other._point, other._head, other._pos, other._static = self._point, self._head, self._pos, self._static
        other._known, other._assumed = dict(self._known), dict(self._assumed)
        if self._choice is not None:
            other._choice = _copy_choice(self._choice)
        if self._replay is not None and self._replay.ended:
            other._result = self._result
        return other

    def finish(self) -> Point:
        """After EOS: the schedule -- the full replay (postprocessors included; raises what it raised),
        converted to .tsched statements."""
        if not self.done:
            raise SentenceError("the sentence is not finished")
        if self.error is not None:
            raise self.error
        if self._assumed:  # sites answered by their shape and not yet checked: a full replay checks them
            self.close()
            self._replay, self._result = None, None
        if self._result is None:
            if self._replay is not None and not self._replay.ended:
                self._drain(len(self.decisions) + 1)
                if self.error is not None:
                    raise self.error
            else:
                made = list(self.decisions)

                def choose(p, prefix):
                    self._met(len(prefix), p)
                    return made[len(prefix)]
                self._result = self.space.replay(self.sketch, choose, convert=False)
            self._phase = "DONE"
        point = self._result
        if not point.stmts:
            from tensorlang.space.convert import trace_to_statements
            point.stmts, _ = trace_to_statements(point.trace, self.space.mod, self.space.op)
        return point

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


def _copy_choice(c):
    if isinstance(c, _TileChoice):
        out = _TileChoice((), c.n)
        out.cands, out.factors, out.num, out.pending = list(c.cands), list(c.factors), list(c.num), list(c.pending)
        return out
    out = _Choice(list(c.seqs))
    out.pos = c.pos
    return out


class _Stopped(Exception):
    pass


_STOP = object()
