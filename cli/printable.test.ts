import { describe, expect, it } from '@jest/globals';
import { printable, printableJSON, printableJSONText } from './printable.ts';

/** What a hostile server sends to take over a terminal, one trick each. */
const HOSTILE: [string, string, string][] = [
  ['an OSC title change ended by BEL', 'ok \u001b]0;owned\u0007', 'ok \\u001b]0;owned\\u0007'],
  ['a CSI erasing the screen', '\u001b[2J\u001b[Hclean', '\\u001b[2J\\u001b[Hclean'],
  ['a carriage return painting over the line', 'denied\rallowed', 'denied\\u000dallowed'],
  ['a line break faking a second line', 'x\nsealion: logged in', 'x\\u000asealion: logged in'],
  ['the 8-bit CSI of C1', '\u009b2J', '\\u009b2J'],
  ['a bidi override reversing what follows', 'user\u202etxt.exe', 'user\\u202etxt.exe'],
  ['bidi isolates', 'a\u2066b\u2069c', 'a\\u2066b\\u2069c'],
  ['a zero-width space and a line separator', 'ad\u200bmin\u2028', 'ad\\u200bmin\\u2028'],
  ['a tag character hiding ASCII', 'a\u{e0041}', 'a\\udb40\\udc41'],
];

describe('printable', () => {
  it.each(HOSTILE)('escapes %s', (_name, text, shown) => {
    expect(printable(text)).toBe(shown);
  });

  it('keeps plain text and other scripts, and cuts long text with ASCII dots', () => {
    expect(printable('plain text, ünïcode too, 東京')).toBe('plain text, ünïcode too, 東京');
    expect(printable('x'.repeat(400))).toBe(`${'x'.repeat(300)}...`);
    expect(printable('x'.repeat(400), Infinity)).toBe('x'.repeat(400));
    // Never half a surrogate pair.
    expect(printable(`${'x'.repeat(299)}😀`)).toBe(`${'x'.repeat(299)}...`);
  });

  it('makes JSON printable without changing what it parses to', () => {
    const value = { user: { username: HOSTILE.map(([, text]) => text).join('|'), groups: ['\u009b', 'ok'] } };
    const shown = printableJSON(value);
    expect(shown).not.toMatch(/[^\n\P{Cc}]|[\p{Cf}\p{Zl}\p{Zp}]/u);
    expect(JSON.parse(shown)).toEqual(value);
  });

  it('makes JSON lines printable without changing what each parses to, keeping their line breaks', () => {
    // A recording as the concierge writes it (JSON.stringify), of a session that printed each trick and an OSC 52
    // by its C1 codes, which JSON.stringify leaves raw.
    const events = [...HOSTILE.map(([, text], i) => [i, 'o', text]), [9, 'o', '\u009d52;c;aGk=\u009c\u007f']];
    const text = [{ version: 2, width: 80, height: 24 }, ...events]
      .map((v) => `${JSON.stringify(v)}\n`)
      .join('');
    expect(text).toMatch(/[\u009b\u009c\u009d\u007f\u202e]/);
    const shown = printableJSONText(text);
    expect(shown).not.toMatch(/[^\n\P{Cc}]|[\p{Cf}\p{Zl}\p{Zp}]/u);
    const parse = (t: string): unknown[] =>
      t
        .split('\n')
        .filter(Boolean)
        .map((line) => JSON.parse(line) as unknown);
    expect(parse(shown)).toEqual(parse(text));
    // JSON's own whitespace stays as it is: a file with CRLF line ends or tabs between values still parses.
    expect(printableJSONText('[1,\t"o"]\r\n')).toBe('[1,\t"o"]\r\n');
  });
});
