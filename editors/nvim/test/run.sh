#!/bin/sh
# Headless Neovim checks of editors/nvim: filetype, syntax, and the LSP client against a fake
# server. Needs nvim (0.7+; NVIM=/path/to/nvim picks another) and python3.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
exec timeout 120 "${NVIM:-nvim}" --headless -u NONE -i NONE \
  --cmd "set rtp^=$here" \
  -c "luafile $here/test/check.lua" 2>&1
