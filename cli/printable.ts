// Text from a server, made safe to print on the user's terminal. An issuer's error, a cluster's Status message, a
// username or a group could carry escape sequences that rewrite the screen or the window title (ESC, the 8-bit CSI
// of C1), a carriage return or line break that paints a fake line over a real one, a BEL, or Unicode's invisible
// format characters: bidi overrides that show text in another order than it is, zero-width characters, the tag
// characters that hide ASCII. All of them are shown as \uXXXX escapes (characters beyond the BMP as their
// surrogate pair), which is also JSON's escape: JSON made printable still parses to the same value.
//
// This is the one function every path that prints server text goes through, and main.ts passes every error
// message through it as well, for text a library put in one.

/** Control (Cc), format (Cf) and line or paragraph separator (Zl, Zp) characters. */
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;
/** A message longer than this is cut (Status messages can carry a whole object). Default of printable's maxLength. */
const MAX_LENGTH = 300;

const escape = (c: string): string => {
  let out = '';
  // A character beyond the BMP is two UTF-16 code units; each is written as its own escape.
  for (let i = 0; i < c.length; i++) out += `\\u${c.charCodeAt(i).toString(16).padStart(4, '0')}`;
  return out;
};

/**
 * `text` with every control and invisible format character escaped, and cut after `maxLength` characters
 * (default 300; Infinity keeps it whole) with "..." to say so.
 */
export function printable(text: string, maxLength = MAX_LENGTH): string {
  const safe = text.replace(UNPRINTABLE, escape);
  if (safe.length <= maxLength) return safe;
  // Not in the middle of a surrogate pair: half a character prints as a replacement mark.
  const cut = /[\ud800-\udbff]/.test(safe.charAt(maxLength - 1)) ? maxLength - 1 : maxLength;
  return `${safe.slice(0, cut)}...`;
}

/**
 * A value as indented JSON that is safe on a terminal and parses back to the same value. JSON.stringify escapes C0
 * controls in strings but leaves C1 and format characters raw; its only raw line breaks are the indentation's, so
 * each line is made printable on its own.
 */
export const printableJSON = (value: unknown): string =>
  JSON.stringify(value, null, 2)
    .split('\n')
    .map((line) => printable(line, Infinity))
    .join('\n');

/**
 * Text made of JSON values (a JSON file, or JSON lines such as an asciicast recording), safe on a terminal and read
 * by a JSON parser as the same values: every control and invisible format character but JSON's own whitespace (TAB,
 * LF, CR) is written as its \uXXXX escape. In valid JSON such characters can only stand inside strings, where the
 * escape means the same character; JSON.stringify leaves DEL, the C1 controls (U+009B is CSI, U+009D is OSC) and the
 * format characters raw. Nothing is cut.
 */
export const printableJSONText = (text: string): string =>
  text.replace(/(?![\t\n\r])[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu, escape);
