import { describe, expect, it } from '@jest/globals';
import { printable } from './printable.ts';

describe('printable', () => {
  it('shows control characters as escapes, so a server cannot rewrite the terminal, and cuts long text', () => {
    expect(printable('ok \u001b]0;owned\u0007 \u009b2J')).toBe('ok \\u001b]0;owned\\u0007 \\u009b2J');
    expect(printable('line\nbreak')).toBe('line\\u000abreak');
    expect(printable('x'.repeat(400))).toBe(`${'x'.repeat(300)}…`);
    expect(printable('plain text, ünïcode too')).toBe('plain text, ünïcode too');
  });
});
