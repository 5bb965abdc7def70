-- Headless checks of lua/tensorlang.lua and syntax/tsched.vim; run by test/run.sh.
local here = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h')
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

local function eq(actual, expected, what)
  if not vim.deep_equal(actual, expected) then
    error(('%s: expected %s, got %s'):format(what, vim.inspect(expected), vim.inspect(actual)), 2)
  end
end

local get_clients = vim.lsp.get_clients or vim.lsp.get_active_clients

local function tensorlang_clients(bufnr)
  local found = {}
  for _, client in ipairs(get_clients()) do
    if client.name == 'tensorlang' and (bufnr == nil or vim.lsp.buf_is_attached(bufnr, client.id)) then
      table.insert(found, client)
    end
  end
  return found
end

local function wait_attached(bufnr)
  local attached = vim.wait(10000, function()
    return #tensorlang_clients(bufnr) == 1
  end, 20)
  if not attached then
    error('no tensorlang client attached to buffer ' .. bufnr, 2)
  end
  return tensorlang_clients(bufnr)[1]
end

local function write(path, text)
  vim.fn.mkdir(vim.fn.fnamemodify(path, ':h'), 'p')
  vim.fn.writefile(vim.split(text, '\n'), path)
end

local function syntax_at(pattern)
  local lnum = vim.fn.search(pattern, 'cw')
  assert(lnum > 0, 'pattern not found: ' .. pattern)
  return vim.fn.synIDattr(vim.fn.synID(lnum, vim.fn.col('.'), 1), 'name')
end

local sample = table.concat({
  '# a matmul',
  'target cpu = llvm(mcpu = "sapphirerapids", cores = 2)',
  'op matmul(A: f32[64, 64], B: f32[64, 64]) -> C: f32[64, 64] {',
  '    C[i, j] += A[i, k] * B[k, j]',
  '}',
  'schedule matmul on cpu {',
  '    i0, i1 = split(C.i, [16, 4])',
  '    bind(i0, blockIdx.x)',
  '    CL = cache_write(C, 0, local)',
  '}',
}, '\n')

local tmp = vim.fn.resolve(vim.fn.tempname())
local project = tmp .. '/project'
local loose = tmp .. '/loose'
local log = tmp .. '/server.log'
vim.fn.mkdir(project .. '/.git', 'p')
for _, path in ipairs({ project .. '/pre.tsched', project .. '/sub/a.tsched', project .. '/sub/b.tsched',
  loose .. '/c.tsched', loose .. '/d.tsched' }) do
  write(path, sample)
end
local server_cmd = { 'python3', here .. '/fake_server.py', log }

local function log_lines()
  return vim.fn.filereadable(log) == 1 and vim.fn.readfile(log) or {}
end

vim.cmd('syntax on')
-- A buffer opened before setup(): Neovim's own detection (on with :syntax on) guesses `conf`.
vim.cmd('edit ' .. project .. '/pre.tsched')
local pre = vim.api.nvim_get_current_buf()

check('setup rejects a cmd that is not a list', function()
  assert(not pcall(require('tensorlang').setup, { cmd = 'tensorlang lsp' }))
  assert(not pcall(require('tensorlang').setup, { cmd = {} }))
end)

check('setup{} adopts buffers opened before it', function()
  assert(vim.bo[pre].filetype ~= 'tsched', 'filetype before setup: ' .. vim.bo[pre].filetype)
  require('tensorlang').setup({ cmd = server_cmd })
  eq(vim.bo[pre].filetype, 'tsched', 'filetype after setup')
  wait_attached(pre)
end)

local first
check('*.tsched files get the tsched filetype and # comments', function()
  vim.cmd('edit ' .. project .. '/sub/a.tsched')
  eq(vim.bo.filetype, 'tsched', 'filetype')
  eq(vim.bo.commentstring, '# %s', 'commentstring')
  eq(vim.bo.comments, ':#', 'comments')
end)

check('syntax/tsched.vim highlights the schedule language', function()
  eq(vim.b.current_syntax, 'tsched', 'current_syntax')
  eq(syntax_at([[\<split\>]]), 'tschedPrimitive', 'split')
  eq(syntax_at([[blockIdx\.x]]), 'tschedThreadAxis', 'blockIdx.x')
  eq(syntax_at([[C\.i]]), 'tschedLoopRef', 'C.i')
  eq(syntax_at([[\<local\>]]), 'tschedScope', 'local')
  eq(syntax_at([[\<f32\>]]), 'tschedType', 'f32')
  eq(syntax_at([[+=]]), 'tschedAssign', '+=')
  eq(syntax_at([[^\s*\zsi0]]), 'tschedBinding', 'i0 binding')
  eq(syntax_at([[A\[i]]), 'tschedTensor', 'A[')
  eq(syntax_at([[op \zsmatmul]]), 'tschedOpName', 'op name')
  eq(syntax_at([[on \zscpu]]), 'tschedTargetName', 'target after on')
  eq(syntax_at([[\<16\>]]), 'tschedNumber', '16')
  eq(syntax_at([[# a matmul]]), 'tschedComment', 'comment')
end)

check('the language server starts with the project root (the .git directory)', function()
  first = wait_attached(0)
  eq(first.config.root_dir, project, 'root_dir')
  eq(first.config.cmd, server_cmd, 'cmd')
  vim.wait(5000, function()
    return vim.tbl_contains(log_lines(), 'textDocument/didOpen')
  end, 20)
  local lines = log_lines()
  for _, expected in ipairs({ 'initialize', 'initialized', 'textDocument/didOpen', 'rootUri ' .. vim.uri_from_fname(project) }) do
    assert(vim.tbl_contains(lines, expected), expected .. ' not in server log:\n' .. table.concat(lines, '\n'))
  end
end)

check('a second file of the same project reuses the client', function()
  vim.cmd('edit ' .. project .. '/sub/b.tsched')
  local client = wait_attached(0)
  eq(client.id, first.id, 'client id')
  eq(#tensorlang_clients(), 1, 'tensorlang clients')
end)

check('outside a git repository the root is the file directory', function()
  eq(require('tensorlang').root_dir(loose .. '/c.tsched'), loose, 'root_dir()')
  eq(require('tensorlang').root_dir(project .. '/sub/a.tsched'), project, 'root_dir() in a repo')
  vim.cmd('edit ' .. loose .. '/c.tsched')
  local client = wait_attached(0)
  eq(client.config.root_dir, loose, 'root_dir')
  assert(client.id ~= first.id, 'expected a second client')
  eq(#tensorlang_clients(), 2, 'tensorlang clients')
end)

check('a missing server executable warns once and starts nothing', function()
  local messages = {}
  local notify = vim.notify
  vim.notify = function(msg, level)
    table.insert(messages, { msg, level })
  end
  require('tensorlang').setup({ cmd = { 'tensorlang-not-installed-here', 'lsp' } })
  vim.cmd('edit ' .. loose .. '/d.tsched')
  vim.cmd('edit ' .. project .. '/pre.tsched') -- already tsched: no second warning
  vim.cmd('edit ' .. loose .. '/d.tsched')
  vim.cmd('setfiletype tsched')
  vim.notify = notify
  eq(vim.bo.filetype, 'tsched', 'filetype')
  eq(#tensorlang_clients(vim.api.nvim_get_current_buf()), 0, 'clients on d.tsched')
  eq(#messages, 1, 'warnings')
  assert(messages[1][1]:find('tensorlang-not-installed-here', 1, true), messages[1][1])
  eq(messages[1][2], vim.log.levels.WARN, 'level')
end)

for _, client in ipairs(tensorlang_clients()) do
  vim.lsp.stop_client(client.id)
end
vim.wait(5000, function()
  return #tensorlang_clients() == 0
end, 20)
vim.fn.delete(tmp, 'rf')

io.stdout:write(('%d passed, %d failed\n'):format(passed, failed))
vim.cmd(failed == 0 and 'qall!' or 'cquit!')
