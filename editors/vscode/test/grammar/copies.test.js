'use strict';

// The grammar tests named after an example must stay copies of it: the example file from
// examples/ with only the SYNTAX TEST header and the assertion lines added.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const examples = path.resolve(__dirname, '../../../../examples');
const copies = fs.readdirSync(__dirname).filter((name) => name.endsWith('.tsched') && name !== 'edge_cases.tsched');

function withoutAssertions(text) {
  const [header, ...lines] = text.split('\n');
  assert.match(header, /^# SYNTAX TEST "source\.tsched"/);
  // The same rule vscode-tmgrammar-test uses to tell assertion lines from source lines.
  return lines.filter((line) => !/^#\s*(\^|<~*-+)/.test(line)).join('\n');
}

test('every reference example has an annotated copy', () => {
  assert.deepEqual(copies.sort(), ['auto.tsched', 'conv2d.tsched', 'dense_gelu.tsched', 'matmul.tsched', 'softmax.tsched']);
});

for (const name of copies) {
  const original = path.join(examples, name);
  test(`test/grammar/${name} is examples/${name} plus assertions`, { skip: !fs.existsSync(original) && `${original} not found` }, () => {
    const copy = fs.readFileSync(path.join(__dirname, name), 'utf8');
    assert.equal(withoutAssertions(copy), fs.readFileSync(original, 'utf8'));
  });
}
