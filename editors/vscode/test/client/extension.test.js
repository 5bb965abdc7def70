'use strict';

// Activation tests without VS Code: `vscode` and `vscode-languageclient/node` are replaced by
// in-memory fakes before extension.js is loaded.
const { test, beforeEach } = require('node:test');
const assert = require('node:assert/strict');
const Module = require('node:module');
const path = require('node:path');

const manifest = require('../../package.json');

const STUB_PATHS = {
  vscode: path.join(__dirname, '__fake_vscode__.js'),
  'vscode-languageclient/node': path.join(__dirname, '__fake_languageclient__.js'),
};
const resolveFilename = Module._resolveFilename;
Module._resolveFilename = function resolveWithFakes(request, ...rest) {
  return Object.hasOwn(STUB_PATHS, request) ? STUB_PATHS[request] : resolveFilename.call(this, request, ...rest);
};
function installFake(request, exports) {
  const filename = STUB_PATHS[request];
  const fake = new Module(filename);
  fake.filename = filename;
  fake.loaded = true;
  fake.exports = exports;
  require.cache[filename] = fake;
}

// --- fake state, reset before each test -------------------------------------------------
let userSettings; // what the user set under `tensorlang.server`
let commands; // id -> handler
let configListeners;
let channels;
let clients;
let startError;

const defaults = manifest.contributes.configuration.properties;

installFake('vscode', {
  workspace: {
    getConfiguration(section) {
      return {
        // Like VS Code: the user's value, else the default declared in package.json.
        get(key) {
          if (section === 'tensorlang.server' && Object.hasOwn(userSettings, key)) return userSettings[key];
          return defaults[`${section}.${key}`]?.default;
        },
      };
    },
    onDidChangeConfiguration(listener) {
      configListeners.push(listener);
      return { dispose: () => configListeners.splice(configListeners.indexOf(listener), 1) };
    },
  },
  window: {
    createOutputChannel(name) {
      const channel = {
        name,
        lines: [],
        shown: 0,
        appendLine(line) { this.lines.push(line); },
        show() { this.shown += 1; },
        dispose() {},
      };
      channels.push(channel);
      return channel;
    },
  },
  commands: {
    registerCommand(id, handler) {
      assert.ok(!commands.has(id), `${id} registered twice`);
      commands.set(id, handler);
      return { dispose: () => commands.delete(id) };
    },
  },
});

class FakeLanguageClient {
  constructor(id, name, serverOptions, clientOptions) {
    Object.assign(this, { id, name, serverOptions, clientOptions });
    this.calls = [];
    this.running = false;
    clients.push(this);
  }

  start() {
    this.calls.push('start');
    if (startError) return Promise.reject(startError);
    this.running = true;
    return Promise.resolve();
  }

  stop() {
    this.calls.push('stop');
    if (!this.running) return Promise.reject(new Error('Client is not running and can\'t be stopped'));
    this.running = false;
    return Promise.resolve();
  }

  isRunning() {
    return this.running;
  }
}
installFake('vscode-languageclient/node', { LanguageClient: FakeLanguageClient });

const extensionPath = require.resolve('../../extension');

function loadExtension() {
  delete require.cache[extensionPath];
  return require(extensionPath);
}

function fakeContext() {
  return { subscriptions: [] };
}

// Lets queued promise callbacks (restart, failure reporting) run.
const settle = () => new Promise((resolve) => setImmediate(resolve));

beforeEach(() => {
  userSettings = {};
  commands = new Map();
  configListeners = [];
  channels = [];
  clients = [];
  startError = undefined;
});

test('activate starts one client for tsched files with the default `tensorlang lsp`', async () => {
  const extension = loadExtension();
  const context = fakeContext();
  extension.activate(context);

  assert.equal(clients.length, 1);
  const [client] = clients;
  assert.equal(client.id, 'tensorlang', 'the id makes the client read tensorlang.trace.server');
  assert.deepEqual(client.serverOptions, { command: 'tensorlang', args: ['lsp'] });
  assert.deepEqual(client.clientOptions.documentSelector, [{ scheme: 'file', language: 'tsched' }]);
  assert.equal(channels.length, 1);
  assert.equal(client.clientOptions.outputChannel, channels[0], 'server output goes to our channel');
  assert.deepEqual(client.calls, ['start']);

  assert.ok(commands.has('tensorlang.restartServer'));
  assert.ok(commands.has('tensorlang.showOutput'));
  assert.equal(configListeners.length, 1);
  assert.ok(context.subscriptions.includes(channels[0]), 'the output channel is disposed with the extension');
  for (const disposable of context.subscriptions) disposable.dispose();
  assert.equal(commands.size, 0, 'commands are disposed with the extension');
  await extension.deactivate();
});

test('the server command comes from tensorlang.server.command and args', async () => {
  userSettings = { command: '/opt/tensorlang/bin/tensorlang', args: ['lsp', '--log-level', 'debug'] };
  const extension = loadExtension();
  extension.activate(fakeContext());
  assert.deepEqual(clients[0].serverOptions, {
    command: '/opt/tensorlang/bin/tensorlang',
    args: ['lsp', '--log-level', 'debug'],
  });
  await extension.deactivate();
});

test('tensorlang.server.python starts `<python> -m tensorlang lsp`', async () => {
  userSettings = { python: '/work/.venv/bin/python' };
  const extension = loadExtension();
  extension.activate(fakeContext());
  assert.deepEqual(clients[0].serverOptions, { command: '/work/.venv/bin/python', args: ['-m', 'tensorlang', 'lsp'] });
  await extension.deactivate();
});

test('the restart command stops the client and starts a new one with the current settings', async () => {
  const extension = loadExtension();
  extension.activate(fakeContext());
  await settle();

  userSettings = { command: 'tl-dev' };
  await commands.get('tensorlang.restartServer')();

  assert.equal(clients.length, 2);
  assert.deepEqual(clients[0].calls, ['start', 'stop']);
  assert.equal(clients[0].isRunning(), false);
  assert.deepEqual(clients[1].serverOptions, { command: 'tl-dev', args: ['lsp'] });
  assert.deepEqual(clients[1].calls, ['start']);
  assert.equal(clients[1].clientOptions.outputChannel, channels[0], 'restarts reuse the output channel');
  await extension.deactivate();
});

test('changing tensorlang.server settings restarts the server, other settings do not', async () => {
  const extension = loadExtension();
  extension.activate(fakeContext());
  await settle();
  const [onChange] = configListeners;

  onChange({ affectsConfiguration: (section) => section === 'editor' });
  await settle();
  assert.equal(clients.length, 1);

  userSettings = { args: ['lsp', '--verbose'] };
  onChange({ affectsConfiguration: (section) => ['tensorlang', 'tensorlang.server'].includes(section) });
  await settle();
  assert.equal(clients.length, 2);
  assert.deepEqual(clients[0].calls, ['start', 'stop']);
  assert.deepEqual(clients[1].serverOptions, { command: 'tensorlang', args: ['lsp', '--verbose'] });
  await extension.deactivate();
});

test('two quick restarts leave exactly one server running', async () => {
  const extension = loadExtension();
  extension.activate(fakeContext());
  const restart = commands.get('tensorlang.restartServer');
  await Promise.all([restart(), restart()]);
  assert.equal(clients.length, 3);
  assert.deepEqual(clients.map((c) => c.isRunning()), [false, false, true]);
  await extension.deactivate();
});

test('deactivate stops the running client once', async () => {
  const extension = loadExtension();
  extension.activate(fakeContext());
  await settle();

  await extension.deactivate();
  assert.deepEqual(clients[0].calls, ['start', 'stop']);
  await extension.deactivate();
  assert.deepEqual(clients[0].calls, ['start', 'stop']);
});

test('a server that cannot start is reported in the output channel without failing activation', async () => {
  startError = new Error('Launching server using command tensorlang failed.');
  const extension = loadExtension();
  assert.doesNotThrow(() => extension.activate(fakeContext()));
  await settle();

  const [channel] = channels;
  assert.ok(channel.shown >= 1, 'the output channel is revealed');
  assert.ok(channel.lines.some((line) => line.includes('Could not start "tensorlang lsp"')), channel.lines.join('\n'));
  await extension.deactivate();
  assert.deepEqual(clients[0].calls, ['start'], 'a client that never ran is not stopped');
});

test('the showOutput command reveals the output channel', async () => {
  const extension = loadExtension();
  extension.activate(fakeContext());
  commands.get('tensorlang.showOutput')();
  assert.equal(channels[0].shown, 1);
  await extension.deactivate();
});
