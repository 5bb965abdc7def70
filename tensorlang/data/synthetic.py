"""Synthetic training operators: matmuls whose output or reduction is wide and oddly factored.

    .venv/bin/python -m tensorlang.data.synthetic data/workloads-variants/wide-matmuls

Why: a tile's factors must divide its loop's extent, so the best tiling of a wide loop depends on how the
extent factors -- 50257 (GPT-2's vocabulary) = 29 * 1733 leaves no vector-wide innermost factor, 11008 =
2^8 * 43 leaves 16 of them. The training models have few loops over 10,000 wide, all from vocabularies, and the
shipped model learnt their lesson (innermost factor 1) for most wide loops: of 11 extents of 10,000-50,257 probed
as N of a 128x4096 @ 4096xN matmul, 7 got innermost factor 1 (11008: `split(j, [1, 1, 11008, 1])`, unvectorised),
only 10240, 12288, 16384 and 20480 got 16.
These operators give it wide loops of many factorizations (a power of two times an odd prime, a product of two
primes, smooth ones) in the shapes models have: LM heads and MLP projections, 1 to 128 rows.

Deterministic (seeded). Each operator's other wide dimension is the largest of 256-2048 that keeps it near
1.5 GFLOP (up to 3.3 where even 256 is over): 64 candidates of one took 38 s to measure on average (znver4, two
cores). No extent of the held-out operators is drawn, nor a relative of their widest (11008 = 2^8 * 43: no
2^a * 43 either), and `collect --skip-heldout` and `train` refuse held-out keys whatever is written here.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

MODEL = "wide-matmuls"
HELDOUT_EXTENTS = frozenset({11008})  # the held-out LLaMA-7B layer's widest loop: neither it nor a relative drawn
MAX_FLOPS = 1.5e9


def _primes(lo: int, hi: int) -> list[int]:
    return [n for n in range(max(lo, 2), hi) if all(n % d for d in range(2, int(n ** 0.5) + 1))]


def _odd_part(n: int) -> int:
    while n % 2 == 0:
        n //= 2
    return n


HELDOUT_ODD_PARTS = frozenset(_odd_part(h) for h in HELDOUT_EXTENTS)


def wide_extents(seed: int = 0, count: int = 30) -> list[int]:
    """`count` distinct extents between 2,000 and 60,000, a third of each kind: 2^a * p (p an odd prime),
    p * q (two odd primes over 20: no factor a vector could fill), and 2^a * 3^b * 5^c * 7^d (smooth). None
    shares its odd part with a held-out extent (11008 = 2^8 * 43: no 2^a * 43)."""
    rng = random.Random(seed)
    odd = _primes(3, 400)
    big = _primes(23, 250)
    out: list[int] = []

    def add(n: int) -> None:
        if 2000 <= n <= 60000 and n not in out and _odd_part(n) not in HELDOUT_ODD_PARTS:
            out.append(n)

    kinds = [lambda: 2 ** rng.randint(4, 10) * rng.choice(odd),
             lambda: rng.choice(big) * rng.choice(big),
             lambda: 2 ** rng.randint(2, 9) * 3 ** rng.randint(0, 3) * 5 ** rng.randint(0, 2) * 7 ** rng.randint(0, 2)]
    for i, kind in enumerate(kinds):
        while len(out) < count * (i + 1) // len(kinds):
            add(kind())
    return out


def shapes(seed: int = 0, count: int = 30) -> list[tuple[int, int, int, str]]:
    """(M, K, N, what is wide): most with a wide output (N), every fourth with a wide reduction (K)."""
    rng = random.Random(seed + 1)
    out = []
    for i, wide in enumerate(sorted(wide_extents(seed, count), key=lambda n: rng.random())):
        m = rng.choice([1, 16, 32, 64, 128])
        other = max((k for k in (256, 512, 768, 1024, 2048) if 2 * m * k * wide <= MAX_FLOPS), default=256)
        out.append((m, wide, other, "K") if i % 4 == 3 else (m, other, wide, "N"))
    return out


def tsched(m: int, k: int, n: int) -> tuple[str, str]:
    name = f"matmul_{m}x{k}x{n}"
    text = (f"# {MODEL} (synthetic, tensorlang.data.synthetic): task {name}\n"
            f"# occurrences: 1; FLOPs: {2 * m * k * n} per occurrence\n\n"
            f"op {name}(a: f32[{m}, {k}], b: f32[{k}, {n}]) -> c: f32[{m}, {n}] {{\n"
            f"    c[i, j] += a[i, r] * b[r, j]\n"
            f"}}\n")
    return name, text


def write(out_dir: str | Path, seed: int = 0, count: int = 30) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for m, k, n, _ in shapes(seed, count):
        name, text = tsched(m, k, n)
        f = out_dir / f"{name}.tsched"
        f.write_text(text)
        files.append(f)
    manifest = {"model": MODEL, "description": __doc__.split("\n")[0], "seed": seed, "count": count,
                "generator": f"python -m tensorlang.data.synthetic {out_dir}",
                "tasks": [f.name for f in files]}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return files


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1].strip())
    for f in write(sys.argv[1]):
        print(f)
