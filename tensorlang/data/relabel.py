"""Re-label measured records made before records named their host CPU (`tensorlang data relabel`), and
rename one machine id into another (`tensorlang data rename-machine`).

Until the machine module existed, a record's `machine` was a hash of the vendor's model name and the
core count ("AMD EPYC|2"): a Zen 3 and a Zen 4 machine got the same id, and record keys (which hold
the machine) could not keep their latencies apart. Every such record was timed on one machine, so it
can be re-labelled without measuring again: the machine becomes that CPU's id, the record names the
host that timed it (`host`) and the CPU its code was built for (`compiled_for`, from the sentence's
`cpu:` token), its key is recomputed with the new machine, and the old key is kept as `key_v1`.

The dataset is rewritten beside itself and swapped in at the end; a record that already has
`key_v1` is copied as it is, so a second run changes nothing.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from tensorlang.data.collect import host_record, record_key
from tensorlang.data.dataset import SHARD_RECORDS, Writer, read
from tensorlang.machine import CPU, cpu_features, detectable_features, host

_TARGET_CPU = re.compile(r"\bTARGET llvm cpu:(\S+)")


def described_cpu(name: str, cores: int, model: str = "") -> CPU:
    """A CPU known by its LLVM name alone: LLVM's features for it (the instruction sets host detection
    would report), no caches read."""
    return CPU(name, cpu_features(name) & detectable_features(), cores, model=model)


def relabel_record(rec: dict, timed_on: CPU) -> dict:
    if "key_v1" in rec:
        return rec
    out = {k: v for k, v in rec.items() if k != "sha256"}
    m = _TARGET_CPU.search(rec.get("sentence", ""))
    out["compiled_for"] = m.group(1) if m and m.group(1) != "generic" else timed_on.name
    out["key_v1"] = rec["key"]
    out["machine"] = timed_on.id
    out["host"] = host_record(timed_on)
    out["key"] = record_key(rec["task"]["hash"], rec["target"], timed_on.id, rec["sketch"], rec["decisions"])
    return out


def _rewrite(root: Path, change, machines: dict) -> tuple[int, int]:
    """Rewrite the dataset at `root` beside itself with `change(rec)` (a new record, or None to copy it
    as it is) and swap it in at the end; in the `metaschedule-N.done` files beside the shards (which hold
    the machine too) each machine id of `machines` (filled in by `change`) becomes its value. Where
    nothing changes, nothing is rewritten."""
    new = root.with_name(root.name + ".relabel")
    shutil.rmtree(new, ignore_errors=True)
    changed = kept = 0
    with Writer(new, shard_records=SHARD_RECORDS) as w:
        for rec in read(root):
            out = change(rec)
            w.append(rec if out is None else out)
            changed, kept = changed + (out is not None), kept + (out is None)
        w.close(compress_open=True)
    if not changed:  # left as it is, byte for byte
        shutil.rmtree(new)
        return changed, kept
    for done in root.glob("*.done"):
        text = done.read_text()
        for old, to in machines.items():
            # `task|target|machine` lines, and model-candidates.done's `task|target|machine|model run`
            text = text.replace(f"|{old}\n", f"|{to}\n").replace(f"|{old}|", f"|{to}|")
        (new / done.name).write_text(text)
    old = root.with_name(root.name + ".v1")
    root.rename(old)
    new.rename(root)
    shutil.rmtree(old)
    return changed, kept


def relabel(root: str | Path, timed_on: CPU, old_machine: str | None = None) -> dict:
    """Rewrite the dataset at `root` with every record re-labelled as timed on `timed_on`. Records of
    another machine than `old_machine` (when given) are copied unchanged."""
    machines: dict = {}

    def change(rec):
        if "key_v1" in rec or (old_machine and rec["machine"] != old_machine):
            return None
        machines[rec["machine"]] = timed_on.id
        return relabel_record(rec, timed_on)
    changed, kept = _rewrite(Path(root), change, machines)
    return {"relabelled": changed, "unchanged": kept, "machine": timed_on.id}


def rename_machine(root: str | Path, old: str, new: str) -> dict:
    """Records of machine id `old` become records of `new` (their keys recomputed; `host` stays what
    timed them): for when the machine id's definition changed so that two ids name one machine."""
    def change(rec):
        if rec["machine"] != old:
            return None
        out = {k: v for k, v in rec.items() if k != "sha256"}
        out["machine"] = new
        out["key"] = record_key(rec["task"]["hash"], rec["target"], new, rec["sketch"], rec["decisions"])
        return out
    changed, kept = _rewrite(Path(root), change, {old: new})
    return {"renamed": changed, "unchanged": kept, "machine": new}


def main_relabel(args) -> int:
    cpu = described_cpu(args.timed_on, args.cores, args.model)
    for d in args.dirs:
        print(f"{d}: {relabel(d, cpu, args.old_machine)}")
    return 0


def main_rename_machine(args) -> int:
    new = args.new or host().id
    for d in args.dirs:
        print(f"{d}: {rename_machine(d, args.old, new)}")
    return 0
