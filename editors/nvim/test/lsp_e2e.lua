-- Headless Neovim against the real language server (`tensorlang lsp`), through lua/tensorlang.lua.
-- Run by tests/test_lsp_nvim.py:
--   TENSORLANG_LSP_CMD='/path/.venv/bin/tensorlang lsp' TENSORLANG_E2E_FILE=/tmp/x/bad.tsched \
--     nvim --headless -u NONE -i NONE --cmd 'set rtp^=editors/nvim' -c 'luafile editors/nvim/test/lsp_e2e.lua'
-- The file must have a TS201 error on line 3 and an empty statement line 6 inside a schedule block.
-- Prints `ok NAME` / `FAIL NAME`, then `N passed, N failed`; exits non-zero on a failure.
local passed, failed = 0, 0

local function check(name, fn)
  local ok, err = pcall(fn)
  if ok then
    passed = passed + 1
    io.stdout:write('ok   ' .. name .. '\n')
  else
    failed = failed + 1
    io.stdout:write('FAIL ' .. name .. '\n     ' .. tostring(err) .. '\n')
  end
end

local cmd = vim.split(os.getenv('TENSORLANG_LSP_CMD') or 'tensorlang lsp', ' ', { trimempty = true })
local file = assert(os.getenv('TENSORLANG_E2E_FILE'), 'TENSORLANG_E2E_FILE is not set')
local get_clients = vim.lsp.get_clients or vim.lsp.get_active_clients

require('tensorlang').setup({ cmd = cmd })
vim.cmd('edit ' .. file)
local bufnr = vim.api.nvim_get_current_buf()

local client
check('the tensorlang server starts and attaches', function()
  local attached = vim.wait(30000, function()
    for _, c in ipairs(get_clients()) do
      if c.name == 'tensorlang' and vim.lsp.buf_is_attached(bufnr, c.id) and c.initialized ~= false then
        client = c
        return true
      end
    end
    return false
  end, 50)
  assert(attached, 'no tensorlang client attached')
  assert(client.server_capabilities or client.resolved_capabilities, 'no capabilities')
end)

check('the known error arrives as a diagnostic on its line', function()
  local found
  local ok = vim.wait(60000, function()
    for _, d in ipairs(vim.diagnostic.get(bufnr)) do
      local code = d.code or (d.user_data and d.user_data.lsp and d.user_data.lsp.code)
      if code == 'TS201' then
        found = d
        return true
      end
    end
    return false
  end, 50)
  assert(ok, 'no TS201 diagnostic; got ' .. vim.inspect(vim.diagnostic.get(bufnr)))
  assert(found.lnum == 2 and found.col == 11, ('TS201 at %d:%d, expected 2:11'):format(found.lnum, found.col))
  assert(found.message:find('1 subscript given', 1, true), found.message)
  assert(found.source == 'tensorlang', tostring(found.source))
end)

check('completion in the schedule block lists the primitives', function()
  vim.api.nvim_win_set_cursor(0, { 6, 4 })
  local params = vim.lsp.util.make_position_params()
  local responses = vim.lsp.buf_request_sync(bufnr, 'textDocument/completion', params, 30000)
  assert(responses, 'no completion response')
  local labels = {}
  for _, response in pairs(responses) do
    assert(not response.err, vim.inspect(response.err))
    local result = response.result or {}
    for _, item in ipairs(result.items or result) do
      labels[item.label] = true
    end
  end
  for _, expected in ipairs({ 'split', 'fuse', 'reorder', 'bind', 'compute_at' }) do
    assert(labels[expected], expected .. ' not in ' .. vim.inspect(vim.tbl_keys(labels)))
  end
end)

check('hover answers on the operator', function()
  vim.api.nvim_win_set_cursor(0, { 2, 3 })
  local responses = vim.lsp.buf_request_sync(bufnr, 'textDocument/hover', vim.lsp.util.make_position_params(), 30000)
  local text = ''
  for _, response in pairs(responses or {}) do
    if response.result and response.result.contents then
      text = text .. (response.result.contents.value or vim.inspect(response.result.contents))
    end
  end
  assert(text:find('op f', 1, true), 'hover: ' .. text)
end)

for _, c in ipairs(get_clients()) do
  vim.lsp.stop_client(c.id)
end
vim.wait(5000, function()
  return #get_clients() == 0
end, 20)

io.stdout:write(('%d passed, %d failed\n'):format(passed, failed))
vim.cmd(failed == 0 and 'qall!' or 'cquit!')
