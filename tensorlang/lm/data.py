"""Training data for the tensor language model: token ids from the corpora, with the loss on the decisions.

- pre-training: the sampled, unmeasured sentences under data/pretrain/<target> (learn the space);
- fine-tuning: every correct measured record under data/measured/<target>, its sentence prefixed by its
  quality token -- its latency relative to the best known for that task on that machine, in buckets
  (Q0 <= 1.05x, Q1 <= 1.25x, Q2 <= 2x, Q3 slower) -- so the model learns from all records; generation
  asks for Q0.

An example is (input_ids, labels) with labels -100 on the prompt and on the decision heads (`TILE t3 L0 4`,
`UNROLL`, `LOC t2`: forced tokens, one legal choice each): the loss is on the sketch index and the decision
values, what the model must choose.

Task keys: a record's `task.hash` (sentences v2). The held-out split (data/split.json) was computed with the
v1 keys, so a record is held out when its `hash`, its `hash_v1` or its file:op is in the split. The
validation split is a deterministic tenth of the other task keys (by a hash of the key), kept out of both
stages: sizes are compared on it.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

QUALITY_BOUNDS = (1.05, 1.25, 2.0)  # Q0 .. Q2 upper bounds of latency / best; Q3 is slower
TOP_QUALITY = "Q0"
VALIDATION_FRACTION = 0.1
IGNORE = -100
DEFAULT_PRETRAIN = ("data/pretrain/llvm", "data/pretrain/cuda")
DEFAULT_MEASURED = ("data/measured/llvm", "data/measured/cpu")
_HEADS = {"TILE", "UNROLL", "UNROLL_IMPLICIT", "VECTOR", "THREADS", "CAT", "UNUSED", "LOC"}


class HeldOutRefused(ValueError):
    """Training data that names a held-out task (the benchmark's: data/split.json)."""


# ------------------------------------------------------------------ splits
@dataclass
class HeldOut:
    keys: frozenset = frozenset()
    ops: frozenset = frozenset()  # "file:op" of every held-out task

    @staticmethod
    def load(path: str | Path = "data/split.json") -> "HeldOut":
        p = Path(path)
        if not p.exists():
            return HeldOut()
        split = json.loads(p.read_text())["heldout"]
        return HeldOut(frozenset(split), frozenset(x for v in split.values() for x in v))

    def __contains__(self, task: dict) -> bool:
        return (task.get("hash") in self.keys or task.get("hash_v1") in self.keys
                or f"{task.get('file')}:{task.get('op')}" in self.ops)


def is_validation(task_key: str, fraction: float = VALIDATION_FRACTION) -> bool:
    """Deterministic: the same tasks are validation tasks on every machine and run."""
    h = int(hashlib.sha256(f"tlm-validation|{task_key}".encode()).hexdigest()[:8], 16)
    return h % 10_000 < fraction * 10_000


# ------------------------------------------------------------------ records
def quality_token(ratio: float) -> str:
    for n, bound in enumerate(QUALITY_BOUNDS):
        if ratio <= bound:
            return f"Q{n}"
    return f"Q{len(QUALITY_BOUNDS)}"


def _v2(sentence: str) -> bool:
    from tensorlang.space import sentence as S
    return sentence.split(" ", 4)[:4] == S.version_tokens()


def pretrain_records(dirs=DEFAULT_PRETRAIN) -> list[dict]:
    from tensorlang.data.dataset import read
    return [r for d in dirs for r in read(d) if r.get("sentence") and _v2(r["sentence"])]


def task_machine(record: dict) -> tuple:
    """What a record's latency is comparable within: its task on the machine that timed it."""
    return record["task"]["hash"], record.get("machine")


def measured_records(dirs=DEFAULT_MEASURED) -> list[dict]:
    """The correct measured records (status ok, v2 sentences), each with its `quality` token: its median
    latency over the best known for its task on the machine that timed it."""
    from tensorlang.data.dataset import read
    recs = [r for d in dirs for r in read(d)
            if r.get("status") == "ok" and r.get("median_s") and r.get("sentence") and _v2(r["sentence"])]
    best: dict = {}
    for r in recs:
        k = task_machine(r)
        best[k] = min(best.get(k, float("inf")), r["median_s"])
    out = []
    for r in recs:
        r = dict(r)
        r["ratio"] = r["median_s"] / best[task_machine(r)]
        r["quality"] = quality_token(r["ratio"])
        out.append(r)
    return out


def best_records(records: list[dict], within: float = 1.0, top: int = 1, min_records: int = 0) -> list[dict]:
    """The best record of each task on each machine (ratio 1; the first of ties) -- or, with `within` > 1,
    every distinct schedule within that factor of it (e.g. 1.05: the ones the timing noise cannot tell
    from the best) -- or, with `top` > 1, the `top` fastest distinct schedules of each (as many good
    schedules for every task, however far from the best the k-th is). `min_records`: a task measured fewer
    times than that on a machine is left out -- the best of 8 random schedules is a mediocre one, and with
    `top` 4 half of them would be taught as good."""
    if min_records > 1:
        counts = Counter(map(task_machine, records))
        records = [r for r in records if counts[task_machine(r)] >= min_records]
    seen, out = set(), []
    if top > 1:
        by_task: dict = {}
        for r in sorted(records, key=lambda r: r["ratio"]):  # stable: the first of ties stays first
            k = task_machine(r)
            if (k, r["sentence"]) not in seen and len(by_task.setdefault(k, [])) < top:
                seen.add((k, r["sentence"]))
                by_task[k].append(r)
        return [r for rs in by_task.values() for r in rs]
    for r in records:
        k = task_machine(r)
        if within <= 1.0:
            if r["ratio"] == 1.0 and k not in seen:
                seen.add(k)
                out.append(r)
        elif r["ratio"] <= within and (k, r["sentence"]) not in seen:
            seen.add((k, r["sentence"]))
            out.append(r)
    return out


def refuse_heldout(records: list[dict], heldout: HeldOut, what: str) -> None:
    bad = [r for r in records if r["task"] in heldout]
    if bad:
        tasks = sorted({f"{r['task'].get('file')}:{r['task'].get('op')}" for r in bad})
        raise HeldOutRefused(f"{what}: {len(bad)} records of {len(tasks)} held-out tasks (data/split.json), e.g. "
                             f"{tasks[0]}: held-out tasks never reach fine-tuning")


# ------------------------------------------------------------ the loss mask
def decision_mask(tokens: list[str]) -> list[bool]:
    """True where the loss goes: the sketch index and each decision's value -- not the prompt, nor the
    forced heads (SKETCH, DECISIONS, `TILE <block> <loop> <n>`, `UNROLL`, `VECTOR <block>`, `THREADS <block>
    <loop>`, `LOC <block>`), nor a tile's `= <extent>` and `= <what is left>`, nor [EOS]."""
    mask = [False] * len(tokens)
    try:
        i = tokens.index("SKETCH")
        j = tokens.index("DECISIONS", i)
    except ValueError:
        return mask
    for k in range(i + 1, j):
        mask[k] = True
    # the decisions, one segment per head word
    starts = [k for k in range(j + 1, len(tokens)) if tokens[k] in _HEADS]
    end = tokens.index("[EOS]", j) if "[EOS]" in tokens[j:] else len(tokens)
    for n, s in enumerate(starts):
        e = starts[n + 1] if n + 1 < len(starts) else end
        k = _value_start(tokens, s, e)
        while k < e:
            if tokens[k] == "=":  # a tile's `= <extent>` / `= <what is left>`: forced, no loss
                k = _int_end(tokens, k + 1)
                continue
            mask[k] = True
            k += 1
    return mask


def _int_end(tokens: list[str], k: int) -> int:
    """Just past the integer starting at k (NUM> ... <NUM, or one token)."""
    return tokens.index("<NUM", k) + 1 if tokens[k] == "NUM>" else k + 1


def _int_start(tokens: list[str], e: int) -> int:
    """Where the integer ending just before e starts (NUM> ... <NUM, or one token)."""
    if tokens[e - 1] == "<NUM":
        k = e - 1
        while k > 0 and tokens[k] != "NUM>":
            k -= 1
        return k
    return e - 1


def _value_start(tokens: list[str], s: int, e: int) -> int:
    from tensorlang.space import sentence as S
    head = tokens[s]
    if head in ("UNROLL", "UNROLL_IMPLICIT", "CAT", "UNUSED"):
        return s + 1
    if head in ("VECTOR", "THREADS"):
        return _int_start(tokens, e)
    if head == "LOC":  # LOC <block> then inline | root | <tensor> ...
        k = s + 2
        while k < e and not (tokens[k] in ("inline", "root") or (tokens[k][:1] == "t" and tokens[k][1:].isdigit())):
            k += 1
        return k
    # TILE <block> <loop words> <n>, then `= <extent>` and the factors (with `= <what is left>` between them)
    k = s + 2
    while k < e and not S.is_loop_word(tokens[k]):
        k += 1
    while k < e and S.is_loop_word(tokens[k]):
        k += 1
    return _int_end(tokens, k)


# ------------------------------------------------------------------ examples
def example(tokens: list[str], ids: dict) -> dict:
    input_ids = [ids[t] for t in tokens]
    labels = [i if m else IGNORE for i, m in zip(input_ids, decision_mask(tokens))]
    return {"input_ids": input_ids, "labels": labels}


def sentence_tokens(record: dict, quality: bool) -> list[str]:
    toks = record["sentence"].split()
    return ([record["quality"]] + toks) if quality else toks


@dataclass
class Corpus:
    """Examples of one stage, split into training and validation, with what they came from."""
    train: list = field(default_factory=list)
    validation: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def build(records: list[dict], quality: bool, heldout: HeldOut, *, max_tokens: int | None = None,
          max_len: int = 768, seed: int = 0, validation_cap: int | None = None,
          include_heldout: bool = False) -> Corpus:
    """Examples from records: held-out tasks dropped unless `include_heldout` (pre-training only), the
    validation tasks apart, a seeded shuffle, the training part cut at `max_tokens`."""
    from tensorlang.space import sentence as S
    ids = S.token_ids()
    kept = [r for r in records if include_heldout or r["task"] not in heldout]
    rng = random.Random(seed)
    order = list(range(len(kept)))
    rng.shuffle(order)
    c = Corpus()
    tokens_train = tokens_val = skipped = 0
    tasks_train, tasks_val, heldout_tasks = set(), set(), set()
    hosts: dict = {}  # the CPUs that timed the training records (measured records only)
    for n in order:
        r = kept[n]
        toks = sentence_tokens(r, quality)
        if len(toks) > max_len or any(t not in ids for t in toks):
            skipped += 1
            continue
        key = r["task"]["hash"]
        if is_validation(key) and r["task"] not in heldout:
            if validation_cap is None or len(c.validation) < validation_cap:
                c.validation.append(example(toks, ids))
                tokens_val += len(toks)
                tasks_val.add(key)
            continue
        if max_tokens is not None and tokens_train + len(toks) > max_tokens:
            continue
        c.train.append(example(toks, ids))
        if (r.get("host") or {}).get("cpu"):
            hosts[r["host"]["cpu"]] = hosts.get(r["host"]["cpu"], 0) + 1
        tokens_train += len(toks)
        tasks_train.add(key)
        if r["task"] in heldout:
            heldout_tasks.add(key)
    c.stats = {"records": len(records), "train_examples": len(c.train), "train_tokens": tokens_train,
               "train_tasks": len(tasks_train), "train_label_tokens": sum(sum(x != IGNORE for x in e["labels"])
                                                                         for e in c.train),
               "validation_examples": len(c.validation), "validation_tokens": tokens_val,
               "validation_tasks": len(tasks_val), "heldout_tasks_in_training": len(heldout_tasks),
               **({"hosts": dict(sorted(hosts.items()))} if hosts else {}),
               "skipped": skipped}
    return c


class Examples:
    """A torch-style map dataset over a list of examples (no torch import needed to build it)."""

    def __init__(self, items: list[dict]):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch: list[dict]) -> dict:
    """Right-padded to the batch's longest: [PAD] inputs, -100 labels, an attention mask."""
    import torch

    from tensorlang.space import sentence as S
    pad = S.token_ids()["[PAD]"]
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.full((len(batch), n), pad, dtype=torch.long)
    labels = torch.full((len(batch), n), IGNORE, dtype=torch.long)
    att = torch.zeros((len(batch), n), dtype=torch.long)
    for k, b in enumerate(batch):
        m = len(b["input_ids"])
        ids[k, :m] = torch.tensor(b["input_ids"])
        labels[k, :m] = torch.tensor(b["labels"])
        att[k, :m] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": att}
