// Text from a server, made safe to print on the user's terminal: an issuer's error, a cluster's Status message or a
// username could carry escape sequences that rewrite the screen, so control characters are shown as escapes, and a
// long text is cut.
// eslint-disable-next-line no-control-regex -- matching control characters is the point
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g;
const MAX_LENGTH = 300;

export function printable(text: string): string {
  const safe = text.replace(CONTROL, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return safe.length > MAX_LENGTH ? `${safe.slice(0, MAX_LENGTH)}…` : safe;
}
