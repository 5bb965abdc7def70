"""The editor integrations' own test suites, run from pytest so `make test` covers them:
the VS Code extension (TextMate grammar scopes, client activation with a stubbed vscode) and
the Neovim setup (filetype, syntax, LSP client) in headless Neovim."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, neovim

VSCODE = ROOT / "editors" / "vscode"
NVIM = ROOT / "editors" / "nvim"


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm (Node.js) is not installed")
def test_vscode_extension_grammar_and_client():
    if not (VSCODE / "node_modules").exists():
        r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=VSCODE, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run(["npm", "test"], cwd=VSCODE, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "fail 0" in r.stdout


def test_neovim_setup():
    env = {**os.environ, "NVIM": neovim()}
    r = subprocess.run(["sh", str(NVIM / "test" / "run.sh")], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:]
    assert " 0 failed" in r.stdout
