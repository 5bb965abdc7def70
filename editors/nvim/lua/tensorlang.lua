-- tensorlang support for Neovim 0.7+: `*.tsched` files get the `tsched` filetype, `#` comments
-- and the tensorlang language server.
--
--   require('tensorlang').setup{}                                       -- runs `tensorlang lsp`
--   require('tensorlang').setup{ cmd = { 'python3', '-m', 'tensorlang', 'lsp' } }
--
-- Options: cmd (list), on_attach (function(client, bufnr)), capabilities (table).
local M = {}

local defaults = {
  cmd = { 'tensorlang', 'lsp' },
  on_attach = nil,
  capabilities = nil,
}

M.config = vim.deepcopy(defaults)

local warned_missing = false
local client_by_root = {} -- Neovim 0.7 only: root_dir -> client id

-- The nearest directory above `path` that contains `.git` (a directory in a clone, a file in a
-- worktree), else the file's own directory.
function M.root_dir(path)
  local dir = vim.fn.fnamemodify(path, ':p:h')
  local current = dir
  while true do
    if (vim.uv or vim.loop).fs_stat(current .. '/.git') then
      return current
    end
    local parent = vim.fn.fnamemodify(current, ':h')
    if parent == current then
      return dir
    end
    current = parent
  end
end

local function start_server(bufnr)
  local cfg = M.config
  if vim.fn.executable(cfg.cmd[1]) ~= 1 then
    if not warned_missing then
      warned_missing = true
      vim.notify(
        ('tensorlang: %q is not executable, so the language server is off; '
          .. "pass cmd to require('tensorlang').setup{}"):format(cfg.cmd[1]),
        vim.log.levels.WARN
      )
    end
    return nil
  end

  local client_config = {
    name = 'tensorlang',
    cmd = cfg.cmd,
    root_dir = M.root_dir(vim.api.nvim_buf_get_name(bufnr)),
    on_attach = cfg.on_attach,
    capabilities = cfg.capabilities,
  }

  if vim.lsp.start then
    -- Neovim 0.8+: starts a client, or reuses the one with the same name and root_dir.
    -- 0.8 attaches the current buffer, so make it `bufnr`.
    local id
    vim.api.nvim_buf_call(bufnr, function()
      id = vim.lsp.start(client_config, { bufnr = bufnr })
    end)
    return id
  end

  -- Neovim 0.7: one client per root directory, attached buffer by buffer.
  local id = client_by_root[client_config.root_dir]
  if not (id and vim.lsp.get_client_by_id(id)) then
    id = vim.lsp.start_client(client_config)
    client_by_root[client_config.root_dir] = id
  end
  if id then
    vim.lsp.buf_attach_client(bufnr, id)
  end
  return id
end

-- Buffer settings and the language server for one `tsched` buffer.
function M.attach(bufnr)
  vim.bo[bufnr].commentstring = '# %s'
  vim.bo[bufnr].comments = ':#'
  return start_server(bufnr)
end

function M.setup(opts)
  opts = opts or {}
  for name, expected in pairs({ cmd = 'table', on_attach = 'function', capabilities = 'table' }) do
    if opts[name] ~= nil and type(opts[name]) ~= expected then
      error(('tensorlang.setup: %s must be a %s'):format(name, expected), 2)
    end
  end
  if opts.cmd and #opts.cmd == 0 then
    error('tensorlang.setup: cmd must not be empty', 2)
  end
  warned_missing = false
  M.config = vim.tbl_extend('force', vim.deepcopy(defaults), opts)

  if vim.filetype and vim.filetype.add then
    vim.filetype.add({ extension = { tsched = 'tsched' } })
  end
  local group = vim.api.nvim_create_augroup('tensorlang', { clear = true })
  vim.api.nvim_create_autocmd({ 'BufNewFile', 'BufRead' }, {
    group = group,
    pattern = '*.tsched',
    command = 'setfiletype tsched',
  })
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = 'tsched',
    callback = function(args)
      M.attach(args.buf)
    end,
  })

  -- Buffers that were open before setup() ran (Vim's own detection guesses `conf` for them).
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) then
      if vim.bo[bufnr].filetype == 'tsched' then
        M.attach(bufnr)
      elseif vim.api.nvim_buf_get_name(bufnr):match('%.tsched$') then
        vim.bo[bufnr].filetype = 'tsched' -- fires the FileType autocmd above
      end
    end
  end
end

-- Lets `:luafile path/to/tensorlang.lua` be followed by `require('tensorlang').setup{}`.
package.loaded.tensorlang = M

return M
