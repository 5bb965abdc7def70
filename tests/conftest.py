import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.tsched"))
TENSORLANG = [sys.executable, "-m", "tensorlang"]


@pytest.fixture(params=EXAMPLES, ids=lambda p: p.stem)
def example(request) -> Path:
    return request.param


def neovim() -> str:
    """Neovim's path: NVIM, or on PATH, or installed now with apt-get (Debian's package); skips the calling test
    only where it cannot be installed. Every test that needs Neovim asks here, so that on a fresh machine the
    first of them installs it (test_editors.py's ran before test_lsp_nvim.py's install and skipped)."""
    found = os.environ.get("NVIM") or shutil.which("nvim")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip("neovim is not installed and apt-get is not available to install it")
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        pytest.skip("neovim is not installed and apt-get needs root (no sudo)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    r = subprocess.run([*sudo, apt, "install", "-y", "-q", "neovim"], capture_output=True, text=True, env=env,
                       timeout=600)
    if r.returncode != 0:
        subprocess.run([*sudo, apt, "update", "-q"], capture_output=True, env=env, timeout=600)
        r = subprocess.run([*sudo, apt, "install", "-y", "-q", "neovim"], capture_output=True, text=True,
                           env=env, timeout=600)
    found = shutil.which("nvim")
    if r.returncode != 0 or not found:
        pytest.skip(f"apt-get could not install neovim: {r.stderr.strip()[-300:]}")
    return found


def operator_space(path, target: str | None = None):
    """The Space of a .tsched file's first operator on `target` (default: the file's first target)."""
    from tensorlang import api
    from tensorlang.space.space import Space
    doc = api.load(path)
    name = next(iter(doc.model.ops))
    return Space(doc.model.ops[name], doc.primfunc(name), doc.model.targets[target or next(iter(doc.model.targets))])


def random_point(space, prefer=None, seed: int = 0, cons=None):
    """A point decoded token by token through ConstrainedTokens, each legal token chosen at random (seeded):
    what a decoder with the preference `prefer` (and the constraints `cons`) can write."""
    import random

    from tensorlang.space import constraints as C
    dec = C.ConstrainedTokens(space, cons, prefer=prefer)
    rng = random.Random(seed)
    try:
        while not dec.done:
            dec.push(rng.choice(sorted(dec.allowed())))
        return dec.finish()
    finally:
        dec.close()
