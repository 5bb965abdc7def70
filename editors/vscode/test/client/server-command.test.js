'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { serverCommand } = require('../../server-command');

test('defaults to `tensorlang lsp`', () => {
  assert.deepEqual(serverCommand({}), { command: 'tensorlang', args: ['lsp'] });
  assert.deepEqual(serverCommand(), { command: 'tensorlang', args: ['lsp'] });
});

test('uses the configured command and arguments', () => {
  assert.deepEqual(
    serverCommand({ command: '/opt/tl/bin/tensorlang', args: ['lsp', '--log-level', 'debug'] }),
    { command: '/opt/tl/bin/tensorlang', args: ['lsp', '--log-level', 'debug'] },
  );
  assert.deepEqual(serverCommand({ command: '  tl  ', args: [] }), { command: 'tl', args: [] });
});

test('a python interpreter runs the tensorlang module and wins over command', () => {
  assert.deepEqual(
    serverCommand({ command: 'tensorlang', args: ['lsp'], python: '.venv/bin/python' }),
    { command: '.venv/bin/python', args: ['-m', 'tensorlang', 'lsp'] },
  );
  assert.deepEqual(
    serverCommand({ python: 'python3', args: ['lsp', '--stdio'] }),
    { command: 'python3', args: ['-m', 'tensorlang', 'lsp', '--stdio'] },
  );
});

test('blank or mistyped settings fall back to the defaults', () => {
  assert.deepEqual(serverCommand({ command: '', args: 'lsp', python: '   ' }), { command: 'tensorlang', args: ['lsp'] });
  assert.deepEqual(serverCommand({ command: 42, args: ['lsp', 1], python: null }), { command: 'tensorlang', args: ['lsp'] });
});

test('does not share or mutate the arguments array', () => {
  const settings = { args: ['lsp'] };
  const first = serverCommand(settings);
  first.args.push('--extra');
  assert.deepEqual(settings.args, ['lsp']);
  assert.deepEqual(serverCommand({}).args, ['lsp']);
});
