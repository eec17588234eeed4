// What a recorded session printed, cut down to what a replay needs before it reaches the auditor's terminal. The
// recorded user chose those bytes, and where the recording's events cut them: a filter that looked at each event on
// its own let `ESC ]5` end one event and `2;c;<base64> BEL` start the next, which the terminal reads as one OSC 52
// (a write to the auditor's clipboard). So one state machine reads the whole output, in the shape of the VT500
// parser that terminals share (states GROUND, ESCAPE, CSI, the control strings; C1 codes, CAN, SUB and ESC act from
// any state), and carries its state from one event to the next; its output is the same however the input is cut.
//
// It passes printable text, CR, LF, TAB and BS, and rebuilds (in 7-bit form) the control sequences of SAFE_CSI:
// colours and attributes, cursor movement, erasing and inserting on the screen. Everything else is dropped whole:
// other escape and control sequences (modes, mouse and paste reporting, scroll regions, resets, charsets), OSC
// (titles, clipboard, hyperlinks, colours), DCS, SOS, PM, APC, other C0 controls (BEL, ENQ's answerback, SO/SI), DEL
// and every C1 control. So each piece it writes leaves the terminal in its ground state, nothing it writes asks the
// terminal for an answer, and no mode it sets outlives the replay; colours are reset at the end when the recording
// left them set.
//
// Written here rather than taken from npm: the one VT500 parser there that keeps state across chunks
// (node-ansiparser) is unmaintained, untyped and keeps whole OSC strings in memory; the others (strip-ansi,
// @ansi-tools/parser, util.stripVTControlCharacters) read each string on its own, which is the bug this fixes, and
// xterm's parser comes only inside a whole terminal emulator. What is left is the small machine below.

export interface TerminalFilter {
  /** The part of `text` that is safe to write, given everything written before. */
  write(text: string): string;
  /** What the end of the output still needs: half a character held back, and a reset of colours left set. */
  end(): string;
}

/** The parser's states (VT500's, with DCS, SOS, PM and APC in one, as all of them are dropped). */
const State = {
  Ground: 0,
  Escape: 1,
  EscapeIntermediate: 2,
  CsiEntry: 3,
  CsiParam: 4,
  CsiIntermediate: 5,
  /** A control sequence that will be dropped, read to its final character. */
  CsiIgnore: 6,
  /** An OSC string: dropped, up to ST or BEL. */
  OscString: 7,
  /** A DCS, SOS, PM or APC string: dropped, up to ST. */
  ControlString: 8,
} as const;
type State = (typeof State)[keyof typeof State];

const BS = 0x08;
const TAB = 0x09;
const LF = 0x0a;
const CR = 0x0d;
const CAN = 0x18;
const SUB = 0x1a;
const ESC = 0x1b;
const DEL = 0x7f;
const BEL = 0x07;
/** The replacement character, for half a surrogate pair that no other half completes. */
const REPLACEMENT = '\ufffd';

/**
 * Parameters longer than this drop the sequence. The longest a replay needs is an SGR setting both colours by RGB
 * and a few attributes (about 40 characters); the bound keeps a hostile recording from growing the buffer.
 */
const MAX_PARAMS = 128;

const DIGITS = /^[0-9;]*$/;
/** The control sequences a replay passes, by final character, each with the parameters it may carry. */
const SAFE_CSI: Record<string, RegExp> = {
  // SGR: colours and attributes, with ':' for the sub-parameters of RGB and indexed colours.
  m: /^[0-9;:]*$/,
  // Cursor up, down, forward, back, next and previous line, column, position (H and f), row.
  A: DIGITS,
  B: DIGITS,
  C: DIGITS,
  D: DIGITS,
  E: DIGITS,
  F: DIGITS,
  G: DIGITS,
  H: DIGITS,
  f: DIGITS,
  d: DIGITS,
  // Erase in display, not 3, which erases the viewer's own scrollback; erase in line.
  J: /^[012]?$/,
  K: /^[012]?$/,
  // Insert and delete characters and lines, erase characters: what line editors and pagers redraw with.
  '@': DIGITS,
  P: DIGITS,
  X: DIGITS,
  L: DIGITS,
  M: DIGITS,
};

/** Whether an SGR's parameters only reset (empty, or zeros): nothing is left set after it. */
const isReset = (params: string): boolean => params.split(';').every((p) => /^0*$/.test(p));

const isHighSurrogate = (c: number): boolean => c >= 0xd800 && c <= 0xdbff;
const isSurrogate = (c: number): boolean => c >= 0xd800 && c <= 0xdfff;
/** Where plain text stops in the ground state: a C0 control, DEL, a C1 control, or a surrogate (whole or half). */
// Control characters are what this expression is about.
// eslint-disable-next-line no-control-regex
const NOT_PLAIN = /[\x00-\x1f\x7f-\x9f\ud800-\udfff]/g;

/** A new filter for one recording's output, in its ground state. */
export function newTerminalFilter(): TerminalFilter {
  return new VtFilter();
}

/** The C0 controls a replay passes; they act inside escape and control sequences too, as terminals do. */
const isPassedControl = (c: number): boolean => c === BS || c === TAB || c === LF || c === CR;

/** The parser's state between writes, and a method per group of states it reads in. */
class VtFilter implements TerminalFilter {
  private state: State = State.Ground;
  /** The parameters of the control sequence being read (digits, ';' and ':'), at most MAX_PARAMS long. */
  private params = '';
  /** The control sequence being read has a private marker or an intermediate: it will be dropped. */
  private unusual = false;
  /** A high surrogate that ended the last text: the first half of a character the next text completes. */
  private held = '';
  /** An SGR set colours or attributes that no reset has cleared since. */
  private styled = false;

  write(text: string): string {
    let input = this.held + text;
    this.held = '';
    if (input.length > 0 && isHighSurrogate(input.charCodeAt(input.length - 1))) {
      this.held = input.slice(-1);
      input = input.slice(0, -1);
    }
    let out = '';
    for (let i = 0; i < input.length;) {
      if (this.state === State.Ground) {
        // Most output is plain text: copied up to the next control or surrogate in one slice.
        NOT_PLAIN.lastIndex = i;
        const stop = NOT_PLAIN.exec(input)?.index ?? input.length;
        out += input.slice(i, stop);
        i = stop;
        if (i === input.length) break;
      }
      const c = input.codePointAt(i)!;
      const char = c > 0xffff ? input.slice(i, i + 2) : input.charAt(i);
      if (!this.anywhere(c))
        out += this.state === State.Ground ? inGround(c, char) : this.inSequence(c, char);
      i += char.length;
    }
    return out;
  }

  end(): string {
    const out = (this.held ? REPLACEMENT : '') + (this.styled ? '\x1b[0m' : '');
    this.state = State.Ground;
    this.params = '';
    this.unusual = false;
    this.held = '';
    this.styled = false;
    return out;
  }

  /** The transitions that apply in every state: ESC, CAN, SUB and the C1 controls. True when `c` was one. */
  private anywhere(c: number): boolean {
    if (c === ESC) this.state = State.Escape;
    else if (c === CAN || c === SUB) this.state = State.Ground;
    else if (c >= 0x80 && c <= 0x9f) {
      // The 8-bit forms of ESC P, ESC X, ESC [, ESC ], ESC ^, ESC _; ST and the rest end what was being read.
      if (c === 0x90 || c === 0x98 || c === 0x9e || c === 0x9f) this.state = State.ControlString;
      else if (c === 0x9b) this.state = State.CsiEntry;
      else if (c === 0x9d) this.state = State.OscString;
      else this.state = State.Ground;
    } else return false;
    this.params = '';
    this.unusual = false;
    return true;
  }

  /** The end of a control sequence: its 7-bit form when SAFE_CSI passes it, else nothing. */
  private dispatch(final: string): string {
    this.state = State.Ground;
    const params = this.params;
    const allowed = !this.unusual && SAFE_CSI[final]?.test(params) === true;
    const sequence = allowed ? `\x1b[${params}${final}` : '';
    if (allowed && final === 'm') this.styled = !isReset(params);
    this.params = '';
    this.unusual = false;
    return sequence;
  }

  /** One character (a code point; a lone surrogate stands for itself) in an escape or control sequence state. */
  private inSequence(c: number, char: string): string {
    const state = this.state;
    if (isPassedControl(c) && state !== State.OscString && state !== State.ControlString) return char;
    if (c < 0x20 || c === DEL) {
      if (c === BEL && state === State.OscString) this.state = State.Ground;
      return '';
    }
    switch (state) {
      case State.Escape:
        this.state = afterEscape(c);
        return '';
      case State.EscapeIntermediate:
        if (c > 0x2f) this.state = State.Ground;
        return '';
      case State.CsiEntry:
      case State.CsiParam:
      case State.CsiIntermediate:
        return this.inControlSequence(c, char);
      case State.CsiIgnore:
        if (c >= 0x40 && c <= 0x7e) this.state = State.Ground;
        return '';
      default:
        // OSC and control strings: their content is dropped.
        return '';
    }
  }

  /** A character of a control sequence (CSI) after its introducer, before its final character. */
  private inControlSequence(c: number, char: string): string {
    if (c >= 0x40 && c <= 0x7e) return this.dispatch(char);
    if (c > 0x7e) {
      // Not part of any control sequence: the sequence is broken, and read to its end as one to drop.
      this.state = State.CsiIgnore;
    } else if (c <= 0x2f) {
      this.unusual = true;
      this.state = State.CsiIntermediate;
    } else if (this.state === State.CsiIntermediate) {
      this.state = State.CsiIgnore;
    } else if (c >= 0x3c) {
      // A private marker ('<', '=', '>', '?') only comes first.
      if (this.state === State.CsiParam) this.state = State.CsiIgnore;
      else {
        this.unusual = true;
        this.state = State.CsiParam;
      }
    } else if (this.params.length >= MAX_PARAMS) {
      this.state = State.CsiIgnore;
    } else {
      this.params += char;
      this.state = State.CsiParam;
    }
    return '';
  }
}

/** The state after ESC and `c`. */
function afterEscape(c: number): State {
  if (c <= 0x2f) return State.EscapeIntermediate;
  if (c === 0x5b) return State.CsiEntry;
  if (c === 0x5d) return State.OscString;
  if (c === 0x50 || c === 0x58 || c === 0x5e || c === 0x5f) return State.ControlString;
  // Any other escape sequence (charsets, keypad modes, reset, index, save and restore) is dropped.
  return State.Ground;
}

/** In the ground state, what stopped a run of plain text: a whole character beyond the BMP passes, a half does not. */
function inGround(c: number, char: string): string {
  if (c >= 0x20 && c !== DEL) return isSurrogate(c) ? REPLACEMENT : char;
  return isPassedControl(c) ? char : '';
}
