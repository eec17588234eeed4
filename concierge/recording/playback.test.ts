import { describe, expect, it } from '@jest/globals';
import { Writable } from 'node:stream';
import type { Clock } from '../../lib/clock.ts';
import { ASCIICAST_MALFORMED, parseAsciicast, play, PLAYBACK_OPTIONS, type Asciicast } from './playback.ts';

const HEADER = '{"version":2,"width":80,"height":24,"timestamp":1700000000}';

function cast(events: [number, string, string][], header: Record<string, unknown> = {}): Asciicast {
  return { header: { version: 2, width: 80, height: 24, ...header }, events };
}

/**
 * Plays with a clock that moves only when play sleeps (plus `writeMs` per write, as a slow terminal would take),
 * and returns each sleep and what was written, in order.
 */
async function played(
  recording: Asciicast,
  opts: { speed: number; maxIdleSeconds?: number },
  writeMs = 0,
): Promise<(string | number)[]> {
  let now = 5000;
  const happened: (string | number)[] = [];
  const out = new Writable({
    write(chunk: Buffer, _encoding, done) {
      happened.push(chunk.toString());
      now += writeMs;
      done();
    },
  });
  const clock: Clock = {
    now: () => now,
    setTimeout(fire, ms) {
      happened.push(ms);
      now += ms;
      queueMicrotask(fire);
      return undefined;
    },
    clearTimeout: () => {},
  };
  await play(recording, out, { ...opts, clock });
  return happened;
}

describe('parseAsciicast', () => {
  it('reads the header and the events, skipping blank lines', () => {
    const text = `${HEADER}\n[0.5, "o", "hi"]\r\n\n[1.25, "r", "100x30"]\n[2, "m", "status: Success"]\n`;
    expect(parseAsciicast(text)).toEqual({
      header: { version: 2, width: 80, height: 24, timestamp: 1700000000 },
      events: [
        [0.5, 'o', 'hi'],
        [1.25, 'r', '100x30'],
        [2, 'm', 'status: Success'],
      ],
    });
  });

  it.each([
    { name: 'an empty file', text: '', message: /line 1: no header/ },
    { name: 'a header that is not JSON', text: '{"version":2,', message: /line 1: not JSON/ },
    { name: 'a header that is an array', text: '[2]', message: /line 1: the header must be a JSON object/ },
    { name: 'version 1', text: '{"version":1,"width":80,"height":24}', message: /line 1: version 1/ },
    { name: 'no width', text: '{"version":2,"height":24}', message: /line 1: .*width and height/ },
    {
      name: 'an event cut off',
      text: `${HEADER}\n[0.5, "o", "hi"]\n[0.7, "o", "th`,
      message: /line 3: not JSON/,
    },
    { name: 'an event of two', text: `${HEADER}\n[0.5, "o"]`, message: /line 2: an event must be/ },
    { name: 'a negative time', text: `${HEADER}\n[-1, "o", "x"]`, message: /line 2: .*time/ },
    { name: 'a time as text', text: `${HEADER}\n["1", "o", "x"]`, message: /line 2: .*time/ },
    { name: 'an empty code', text: `${HEADER}\n[1, "", "x"]`, message: /line 2: .*code/ },
    { name: 'data that is not text', text: `${HEADER}\n[1, "o", 7]`, message: /line 2: .*data/ },
  ])('refuses $name, naming the line', ({ text, message }) => {
    let thrown: unknown;
    try {
      parseAsciicast(text);
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toMatchObject({ code: ASCIICAST_MALFORMED, message: expect.stringMatching(message) });
  });
});

describe('play', () => {
  const recording = cast([
    [0.5, 'o', 'a'],
    [1.0, 'i', 'typed'],
    [1.0, 'o', 'b'],
    [1.5, 'r', '100x30'],
    [11.0, 'o', 'c'],
    [11.0, 'm', 'marker'],
    [11.25, 'o', 'd'],
  ]);

  it('writes only the output, at the recorded pace', async () => {
    expect(await played(recording, { speed: 1 })).toEqual([500, 'a', 500, 'b', 10_000, 'c', 250, 'd']);
  });

  it('divides the pace by the speed', async () => {
    expect(await played(recording, { speed: 2 })).toEqual([250, 'a', 250, 'b', 5000, 'c', 125, 'd']);
  });

  it('caps idle gaps before the speed divides them', async () => {
    expect(await played(recording, { speed: 2, maxIdleSeconds: 2 })).toEqual([
      250,
      'a',
      250,
      'b',
      1000,
      'c',
      125,
      'd',
    ]);
  });

  it('takes the header’s idle_time_limit when no cap is given, and the given cap over it', async () => {
    const limited = cast(recording.events, { idle_time_limit: 1 });
    expect(await played(limited, { speed: 1 })).toEqual([500, 'a', 500, 'b', 1000, 'c', 250, 'd']);
    expect(await played(limited, { speed: 1, maxIdleSeconds: 3 })).toEqual([
      500,
      'a',
      500,
      'b',
      3000,
      'c',
      250,
      'd',
    ]);
  });

  it('takes the time spent writing off the next wait, and waits not at all when behind', async () => {
    expect(await played(recording, { speed: 1 }, 300)).toEqual([500, 'a', 200, 'b', 9700, 'c', 'd']);
  });

  it('does not wait for output at the same time, or for times that run backwards', async () => {
    const bursts = cast([
      [1, 'o', 'a'],
      [1, 'o', 'b'],
      [0.5, 'o', 'c'],
      [1.5, 'o', 'd'],
    ]);
    expect(await played(bursts, { speed: 1 })).toEqual([1000, 'a', 'b', 'c', 500, 'd']);
  });

  it('filters the output as one stream: a sequence its events cut is dropped whole, text and colours pass', async () => {
    // OSC 52 (a clipboard write) cut after `ESC ]5`, a DCS cut after ESC, OSC 52 by its C1 code, a colour cut.
    const cut = cast([
      [0.5, 'o', 'a\x1b]5'],
      [0.5, 'o', '2;c;aGk=\x07b\x1b'],
      [0.5, 'o', 'P$qm\x1b\\c\u009d'],
      [0.5, 'o', '52;c;aGk=\u009cd\x1b[3'],
      [0.5, 'o', '1me'],
    ]);
    // The colour is reset after the last output, so the viewer's terminal is not left red.
    expect(await played(cut, { speed: 1 })).toEqual([500, 'a', 'b', 'c', 'd', '\x1b[31me', '\x1b[0m']);
  });

  it.each([
    { speed: 0, maxIdleSeconds: undefined },
    { speed: -1, maxIdleSeconds: undefined },
    { speed: Number.NaN, maxIdleSeconds: undefined },
    { speed: Infinity, maxIdleSeconds: undefined },
    { speed: 1, maxIdleSeconds: -1 },
  ])('refuses speed $speed and maxIdleSeconds $maxIdleSeconds', async (opts) => {
    await expect(played(recording, opts)).rejects.toMatchObject({ code: PLAYBACK_OPTIONS });
  });
});
