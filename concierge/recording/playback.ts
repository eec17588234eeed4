// Reads an asciicast v2 recording (asciicast.ts writes them) and plays its output back at the pace it was recorded,
// for the CLI. It depends on nothing of the concierge's: the CLI carries it without the server.
import { once } from 'node:events';
import { performance } from 'node:perf_hooks';
import { systemClock, type Clock } from '../../lib/clock.ts';
import { SealionError } from '../../lib/errors.ts';
import { newTerminalFilter } from './terminal-filter.ts';

/** The text is not an asciicast v2 recording; the message names the line. */
export const ASCIICAST_MALFORMED = 'SEALION_ASCIICAST_MALFORMED';
/** play() was given a speed or an idle cap it cannot use. */
export const PLAYBACK_OPTIONS = 'SEALION_PLAYBACK_OPTIONS';

export interface Asciicast {
  /** The header line: version 2, width and height, and whatever else the recorder wrote (Sealion's `sealion`). */
  header: Record<string, unknown>;
  /** [seconds since the start, code ("o", "i", "r", "m", …), data]. */
  events: [number, string, string][];
}

export interface PlayOptions {
  /** How much faster than recorded: 1 is real time, 2 twice as fast. */
  speed: number;
  /**
   * The longest pause between two outputs, in recorded seconds (before `speed` divides it). Default: the header's
   * `idle_time_limit` when it has one, else no cap.
   */
  maxIdleSeconds?: number;
  /**
   * The waits' clock. Default: `playbackClock`, the system's timers read against a clock that only moves forward.
   * Tests pass their own.
   */
  clock?: Clock;
}

/**
 * The system's timers, with the time read from performance's clock rather than the wall clock: a wall clock set back
 * or forward during a replay would stall it or rush it.
 */
export const playbackClock: Clock = {
  ...systemClock,
  now: () => performance.timeOrigin + performance.now(),
};

/** Waits `ms` on `clock`. The timer keeps the process alive: the replay is what the CLI is waiting for. */
function sleep(clock: Clock, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimeout(resolve, ms, { keepAlive: true }));
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isPositiveInteger(value: unknown): boolean {
  return typeof value === 'number' && Number.isSafeInteger(value) && value > 0;
}

/** Throws ASCIICAST_MALFORMED, naming the line, for anything that is not asciicast v2. */
export function parseAsciicast(text: string): Asciicast {
  const malformed = (line: number, message: string): SealionError =>
    new SealionError(ASCIICAST_MALFORMED, `asciicast: line ${line}: ${message}`);
  const parse = (line: number, source: string): unknown => {
    try {
      return JSON.parse(source);
    } catch (err) {
      throw malformed(line, `not JSON: ${(err as Error).message}`);
    }
  };
  let header: Record<string, unknown> | undefined;
  const events: [number, string, string][] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const source = lines[i]!.trim();
    if (source === '') continue;
    const value = parse(i + 1, source);
    if (!header) {
      if (!isRecord(value)) throw malformed(i + 1, 'the header must be a JSON object');
      if (value.version !== 2)
        throw malformed(i + 1, `version ${JSON.stringify(value.version)}: only 2 is read`);
      if (!isPositiveInteger(value.width) || !isPositiveInteger(value.height))
        throw malformed(i + 1, 'the header needs width and height, positive integers');
      header = value;
      continue;
    }
    if (!Array.isArray(value) || value.length !== 3)
      throw malformed(i + 1, 'an event must be [time, code, data]');
    const [time, code, data] = value as unknown[];
    if (typeof time !== 'number' || !Number.isFinite(time) || time < 0)
      throw malformed(i + 1, 'an event’s time must be a number of seconds, zero or more');
    if (typeof code !== 'string' || code === '') throw malformed(i + 1, 'an event’s code must be a string');
    if (typeof data !== 'string') throw malformed(i + 1, 'an event’s data must be a string');
    events.push([time, code, data]);
  }
  if (!header) throw malformed(1, 'no header: the recording is empty');
  return { header, events };
}

/**
 * Writes the recording's output ("o" events) to `out`, each when it came relative to the one before, divided by
 * `speed`, with pauses capped at `maxIdleSeconds`. Input, sizes and markers are not shown. Waits are measured
 * from the start, so time spent writing comes off the next wait instead of adding up over a long recording.
 * The output goes through one terminal filter (terminal-filter.ts) from the first event to the last, so only text
 * and the sequences a replay needs reach `out`, wherever the recording's events cut the recorded bytes.
 */
export async function play(cast: Asciicast, out: NodeJS.WritableStream, opts: PlayOptions): Promise<void> {
  const idleLimit = cast.header.idle_time_limit;
  const maxIdleSeconds = opts.maxIdleSeconds ?? (typeof idleLimit === 'number' ? idleLimit : Infinity);
  if (!(Number.isFinite(opts.speed) && opts.speed > 0))
    throw new SealionError(PLAYBACK_OPTIONS, `play: speed: must be a number above 0, not ${opts.speed}`);
  if (!(maxIdleSeconds >= 0))
    throw new SealionError(
      PLAYBACK_OPTIONS,
      `play: maxIdleSeconds: must be 0 or more, not ${maxIdleSeconds}`,
    );
  const clock = opts.clock ?? playbackClock;

  const filter = newTerminalFilter();
  const write = async (text: string): Promise<void> => {
    if (text !== '' && !out.write(text)) await once(out, 'drain');
  };
  const start = clock.now();
  /** Milliseconds after `start` at which the next output is due. */
  let due = 0;
  let previous = 0;
  for (const [time, code, data] of cast.events) {
    if (code !== 'o') continue;
    // A time earlier than the last (a hand-edited file) is no pause.
    const gap = Math.max(0, time - previous);
    previous = Math.max(previous, time);
    due += (Math.min(gap, maxIdleSeconds) * 1000) / opts.speed;
    const wait = due - (clock.now() - start);
    if (wait > 0) await sleep(clock, wait);
    await write(filter.write(data));
  }
  await write(filter.end());
}
