'use strict';

const vscode = require('vscode');
const { LanguageClient } = require('vscode-languageclient/node');
const { serverCommand } = require('./server-command');

// The client id is also the prefix of the `tensorlang.trace.server` setting, which the
// language client reads by itself.
const CLIENT_ID = 'tensorlang';
const CLIENT_NAME = 'tensorlang language server';
const DOCUMENT_SELECTOR = [{ scheme: 'file', language: 'tsched' }];
// How long a restart waits for a server that is still starting before it gives up on it.
const START_WAIT_MS = 5000;

/** @type {vscode.OutputChannel | undefined} */
let outputChannel;
/** @type {{client: LanguageClient, started: Promise<void>} | undefined} */
let current;
// Restarts and stops run one after another, so two quick settings changes cannot leave
// two servers running.
let queue = Promise.resolve();

function enqueue(task) {
  queue = queue.then(task);
  return queue;
}

function readServerSettings() {
  const config = vscode.workspace.getConfiguration('tensorlang.server');
  return { command: config.get('command'), args: config.get('args'), python: config.get('python') };
}

function describe(error) {
  return error instanceof Error ? error.message : String(error);
}

function startClient() {
  const server = serverCommand(readServerSettings());
  const client = new LanguageClient(CLIENT_ID, CLIENT_NAME, server, {
    documentSelector: DOCUMENT_SELECTOR,
    outputChannel,
  });
  const commandLine = [server.command, ...server.args].join(' ');
  outputChannel.appendLine(`Starting the tensorlang language server: ${commandLine}`);
  // Not awaited: activation and restarts do not wait for the server to initialize.
  const started = client.start().catch((error) => {
    outputChannel.appendLine(`Could not start "${commandLine}": ${describe(error)}`);
    outputChannel.appendLine(
      'Install tensorlang, or set tensorlang.server.command (or tensorlang.server.python), '
        + 'then run "tensorlang: Restart Language Server".',
    );
    outputChannel.show(true);
  });
  current = { client, started };
}

async function stopClient() {
  const previous = current;
  current = undefined;
  if (!previous) {
    return;
  }
  let timer;
  const gaveUp = new Promise((resolve) => { timer = setTimeout(resolve, START_WAIT_MS); });
  await Promise.race([previous.started, gaveUp]);
  clearTimeout(timer);
  if (!previous.client.isRunning()) {
    return;
  }
  try {
    await previous.client.stop();
  } catch (error) {
    outputChannel?.appendLine(`Stopping the language server failed: ${describe(error)}`);
  }
}

function restartServer() {
  return enqueue(async () => {
    await stopClient();
    startClient();
  });
}

/** @param {vscode.ExtensionContext} context */
function activate(context) {
  outputChannel = vscode.window.createOutputChannel(CLIENT_NAME);
  context.subscriptions.push(
    outputChannel,
    vscode.commands.registerCommand('tensorlang.restartServer', restartServer),
    vscode.commands.registerCommand('tensorlang.showOutput', () => outputChannel.show()),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration('tensorlang.server')) {
        restartServer();
      }
    }),
  );
  startClient();
}

function deactivate() {
  return enqueue(stopClient);
}

module.exports = { activate, deactivate };
