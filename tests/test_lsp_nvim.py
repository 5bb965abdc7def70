"""A real editor against the real server: headless Neovim (Debian's package) with editors/nvim/lua/tensorlang.lua
starts `tensorlang lsp`, opens a file with a known error, receives that diagnostic on its line, gets a
completion list and a hover. Neovim is installed with apt-get when missing; the test is skipped only if
that is impossible."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import neovim

ROOT = Path(__file__).resolve().parent.parent
NVIM_DIR = ROOT / "editors" / "nvim"

BAD = """target cpu = llvm(cores = 2)
op f(A: f32[4, 4]) -> B: f32[4] {
    B[i] = A[i]
}
schedule f on cpu {
    
}
"""


def _server_cmd() -> str:
    script = Path(sys.executable).parent / "tensorlang"
    if script.exists():
        return f"{script} lsp"
    return f"{sys.executable} -m tensorlang lsp"


def test_neovim_gets_diagnostics_and_completions_from_the_server(tmp_path):
    nvim = neovim()
    f = tmp_path / "bad.tsched"
    f.write_text(BAD)
    env = {**os.environ, "TENSORLANG_LSP_CMD": _server_cmd(), "TENSORLANG_E2E_FILE": str(f),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([nvim, "--headless", "-u", "NONE", "-i", "NONE", "--cmd", f"set rtp^={NVIM_DIR}",
                        "-c", f"luafile {NVIM_DIR / 'test' / 'lsp_e2e.lua'}"],
                       capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "4 passed, 0 failed" in out, out
