"""An append-only dataset of records in sharded, gzip-compressed JSON lines.

Layout of a dataset directory:

    shard-000000.jsonl.gz   closed shards (immutable, compressed)
    shard-000007.jsonl      the open shard (JSON lines, appended and fsync'ed one record at a time)

Every record carries `key` (what makes it unique) and `sha256` (over the record without it), so
a record torn by a kill -- a partial last line -- is detected and dropped, never misread, and a
record is never written twice: the writer loads the keys of everything on disk first. Closing a
shard compresses it to a temporary file and renames it into place (atomic), then removes the
plain file; a kill between the two leaves both, and the reader prefers the compressed one.

One writer at a time: a Writer holds an exclusive `flock` on the directory itself until it is closed
(the kernel drops it when the process dies, however it dies). A second Writer of the same directory --
another process, or another Writer in this one -- is refused (DatasetBusy): two writers would each
compress or rotate the shard the other appends to, and the records appended to a shard compressed under
a writer go to an unlinked file, lost.
"""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

SHARD_RECORDS = 5000


def checksum(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _parse(line: str) -> dict | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("sha256") != checksum(rec):
        return None
    return rec


def _shards(root: Path) -> list[Path]:
    """Shard files in order, each shard once (compressed preferred)."""
    by_id: dict[str, Path] = {}
    for p in sorted(root.glob("shard-*.jsonl*")):
        if p.name.endswith(".tmp"):
            continue
        sid = p.name.split(".")[0]
        if sid not in by_id or p.suffix == ".gz":
            by_id[sid] = p
    return [by_id[k] for k in sorted(by_id)]


def read(root: str | Path) -> Iterator[dict]:
    """Every valid record of a dataset (torn or corrupt lines are skipped)."""
    root = Path(root)
    if not root.exists():
        return
    for shard in _shards(root):
        opener = gzip.open if shard.suffix == ".gz" else open
        try:
            with opener(shard, "rt") as f:
                for line in f:
                    rec = _parse(line)
                    if rec is not None:
                        yield rec
        except (OSError, EOFError):  # a compressed shard cut short: its readable part was yielded
            continue


class DatasetBusy(RuntimeError):
    """Another Writer holds the dataset directory."""


def _lock_dir(root: Path) -> int:
    """An exclusive, non-blocking flock on the directory (no lock file among the shards) -> its fd
    (DatasetBusy if another writer holds it)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DatasetBusy(f"{root} is being written by another writer (a running collect?): one writer at a "
                          "time") from None
    return fd


class Writer:
    """Appends records; skips keys already present; rotates and compresses full shards. Holds the
    directory's writer lock until closed."""

    def __init__(self, root: str | Path, shard_records: int = SHARD_RECORDS):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = _lock_dir(self.root)
        self.shard_records = shard_records
        self.keys: set[str] = set()
        self._open_path: Path | None = None
        self._open_count = 0
        self._file = None
        self._recover()

    def _recover(self):
        # A kill inside `compress`, after the compressed shard is in place and before the plain one is
        # removed, leaves both; `_shards` lists only the compressed one, so the leftover is removed here.
        for plain in self.root.glob("shard-*.jsonl"):
            if plain.with_name(plain.name + ".gz").exists():
                plain.unlink()
        shards = _shards(self.root)
        for shard in shards:
            for_plain = shard.suffix != ".gz"
            valid = []
            opener = gzip.open if not for_plain else open
            try:
                with opener(shard, "rt") as f:
                    for line in f:
                        rec = _parse(line)
                        if rec is not None:
                            self.keys.add(rec["key"])
                            valid.append(line if line.endswith("\n") else line + "\n")
            except (OSError, EOFError):
                pass
            if for_plain:
                # Rewrite the open shard without its torn tail, then keep appending to it.
                text = "".join(valid)
                tmp = shard.with_name(shard.name + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, shard)
                self._open_path, self._open_count = shard, len(valid)
        for stale in self.root.glob("*.tmp"):
            stale.unlink()

    def _next_shard(self) -> Path:
        ids = [int(p.name.split(".")[0].split("-")[1]) for p in _shards(self.root)]
        return self.root / f"shard-{(max(ids) + 1) if ids else 0:06d}.jsonl"

    def append(self, record: dict) -> bool:
        """Write one record durably; False (and nothing written) if its key is present."""
        if record["key"] in self.keys:
            return False
        record = dict(record)
        record["sha256"] = checksum(record)
        if self._open_path is None or self._open_count >= self.shard_records:
            self._rotate()
        if self._file is None:
            self._file = open(self._open_path, "a")
        self._file.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._open_count += 1
        self.keys.add(record["key"])
        return True

    def _rotate(self):
        if self._open_path is not None:
            self._close_file()
            compress(self._open_path)
        self._open_path, self._open_count = self._next_shard(), 0

    def _close_file(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self, compress_open: bool = False):
        self._close_file()
        if compress_open and self._open_path is not None and self._open_path.exists():
            compress(self._open_path)
            self._open_path, self._open_count = None, 0
        if self._lock_fd is not None:  # closing the fd drops the flock
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def compress(plain: Path) -> Path:
    gz = plain.with_name(plain.name + ".gz")
    tmp = gz.with_name(gz.name + ".tmp")
    with open(plain, "rb") as src, gzip.open(tmp, "wb") as dst:
        dst.write(src.read())
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, gz)
    plain.unlink()
    return gz
