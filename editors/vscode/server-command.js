'use strict';

const DEFAULT_COMMAND = 'tensorlang';
const DEFAULT_ARGS = Object.freeze(['lsp']);

function nonEmptyString(value) {
  return typeof value === 'string' && value.trim() !== '' ? value.trim() : undefined;
}

/**
 * Turns the `tensorlang.server.*` settings into the process that runs the language server.
 *
 * - `python` set: `<python> -m tensorlang <args>`
 * - otherwise:    `<command> <args>`
 * `args` defaults to `["lsp"]` and `command` to `tensorlang`; values of the wrong type fall back
 * to the defaults, so a broken settings.json still starts the usual server.
 *
 * @param {{command?: unknown, args?: unknown, python?: unknown}} [settings]
 * @returns {{command: string, args: string[]}}
 */
function serverCommand(settings = {}) {
  const args = Array.isArray(settings.args) && settings.args.every((a) => typeof a === 'string')
    ? [...settings.args]
    : [...DEFAULT_ARGS];
  const python = nonEmptyString(settings.python);
  if (python) {
    return { command: python, args: ['-m', 'tensorlang', ...args] };
  }
  return { command: nonEmptyString(settings.command) ?? DEFAULT_COMMAND, args };
}

module.exports = { serverCommand, DEFAULT_COMMAND, DEFAULT_ARGS };
