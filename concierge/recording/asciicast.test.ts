import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fakeClock, type FakeClock } from '../../test-support/fake-clock.ts';
import {
  newRecorder,
  RECORDING_CREATE,
  RECORDING_OPTIONS,
  type Recorder,
  type RecorderOptions,
} from './asciicast.ts';
import { parseAsciicast } from './playback.ts';

/** 2023-11-14T22:13:20Z: a start whose header timestamp is easy to read. */
const START = 1_700_000_000_000;

let dir: string;
let clock: FakeClock;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sealion-recording-'));
  clock = fakeClock();
  clock.advance(START);
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function options(overrides: Partial<RecorderOptions> = {}): RecorderOptions {
  return {
    path: join(dir, 'session.cast'),
    header: {},
    maxBytes: 1024 * 1024,
    stdin: false,
    clock,
    ...overrides,
  };
}

async function lines(path = join(dir, 'session.cast')): Promise<unknown[]> {
  const text = await readFile(path, 'utf8');
  expect(text.endsWith('\n')).toBe(true);
  return text
    .slice(0, -1)
    .split('\n')
    .map((line) => JSON.parse(line) as unknown);
}

const out = (recorder: Recorder, text: string | Buffer): void => recorder.event('stdout', Buffer.from(text));

describe('the asciicast recorder', () => {
  it('writes a header with Sealion’s fields and events timed from the start, in seconds to the microsecond', async () => {
    const recorder = await newRecorder(
      options({
        header: {
          title: 'exec into web-0',
          env: { TERM: 'xterm-256color' },
          sealion: {
            auditID: 'a1b2',
            user: 'alice',
            cluster: 'edge-1',
            namespace: 'shop',
            pod: 'web-0',
            container: 'app',
            command: ['sh', '-c', 'ls'],
          },
          // The recorder's own fields are not overridden.
          version: 3,
          timestamp: 1,
        },
      }),
    );
    out(recorder, '$ ');
    clock.advance(1234.5678);
    recorder.event('stderr', Buffer.from('warn\n'));
    clock.advance(0.0004);
    recorder.event('resize', Buffer.from('{"Width":132,"Height":43}\n'));
    clock.advance(10_000);
    recorder.event('error', Buffer.from('{"metadata":{},"status":"Success"}'));
    await recorder.close('session closed');

    const [header, ...events] = await lines();
    expect(header).toEqual({
      version: 2,
      width: 80,
      height: 24,
      timestamp: START / 1000,
      title: 'exec into web-0',
      env: { TERM: 'xterm-256color' },
      sealion: {
        auditID: 'a1b2',
        user: 'alice',
        cluster: 'edge-1',
        namespace: 'shop',
        pod: 'web-0',
        container: 'app',
        command: ['sh', '-c', 'ls'],
      },
    });
    expect(events).toEqual([
      [0, 'o', '$ '],
      [1.234568, 'o', 'warn\n'],
      [1.234568, 'r', '132x43'],
      [11.234568, 'm', 'status: Success'],
      [11.234568, 'm', 'session closed'],
    ]);
    const file = join(dir, 'session.cast');
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    expect(recorder.bytes).toBe((await stat(file)).size);
    expect(recorder.truncated).toBe(false);
    // What the CLI's player reads.
    expect(parseAsciicast(await readFile(file, 'utf8')).events).toHaveLength(5);
  });

  it('takes the size given in the header', async () => {
    const recorder = await newRecorder(options({ header: { width: 200, height: 50 } }));
    await recorder.close();
    expect(await lines()).toEqual([{ version: 2, width: 200, height: 50, timestamp: START / 1000 }]);
  });

  it('decodes each channel’s UTF-8 on its own, so a character cut between chunks comes out whole', async () => {
    const recorder = await newRecorder(options({ stdin: true }));
    const euro = Buffer.from('€'); // e2 82 ac
    const fish = Buffer.from('🐟'); // f0 9f 90 9f
    recorder.event('stdout', Buffer.from([0x61, euro[0]!]));
    recorder.event('stderr', Buffer.from([fish[0]!, fish[1]!]));
    recorder.event('stdout', euro.subarray(1, 2));
    recorder.event('stdin', Buffer.from([0xc3]));
    recorder.event('stderr', Buffer.from([fish[2]!]));
    recorder.event('stdout', Buffer.from([euro[2]!, 0x62]));
    recorder.event('stdin', Buffer.from([0xa9]));
    recorder.event('stderr', Buffer.from([fish[3]!]));
    // Cut off at the end: written at close, as the replacement character.
    recorder.event('stdout', Buffer.from([0xe2, 0x82]));
    await recorder.close();
    const [, ...events] = await lines();
    expect(events).toEqual([
      [0, 'o', 'a'],
      [0, 'o', '€b'],
      [0, 'i', 'é'],
      [0, 'o', '🐟'],
      [0, 'o', '\ufffd'],
    ]);
  });

  it.each([
    { stdin: false, want: [[0, 'o', 'password: ']] },
    {
      stdin: true,
      want: [
        [0, 'o', 'password: '],
        [0, 'i', 'hunter2\r'],
      ],
    },
  ])('records stdin only when asked (stdin: $stdin)', async ({ stdin, want }) => {
    const recorder = await newRecorder(options({ stdin }));
    out(recorder, 'password: ');
    recorder.event('stdin', Buffer.from('hunter2\r'));
    await recorder.close();
    const [, ...events] = await lines();
    expect(events).toEqual(want);
  });

  it('records sizes and ignores resize messages that are not one', async () => {
    const recorder = await newRecorder(options());
    for (const garbage of [
      'not json',
      '[80,24]',
      'null',
      '{"Width":0,"Height":24}',
      '{"Width":-1,"Height":24}',
      '{"Width":80.5,"Height":24}',
      '{"Width":"80","Height":24}',
      '{"Width":80}',
      '{"Width":65536,"Height":24}',
    ])
      recorder.event('resize', Buffer.from(garbage));
    recorder.event('resize', Buffer.from('{"Width":65535,"Height":1}'));
    await recorder.close();
    const [, ...events] = await lines();
    expect(events).toEqual([[0, 'r', '65535x1']]);
  });

  it.each([
    {
      name: 'a Failure Status',
      error:
        '{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 3","reason":"NonZeroExitCode"}',
      marker: 'status: Failure: command terminated with non-zero exit code: exit status 3',
    },
    { name: 'a Success Status', error: '{"metadata":{},"status":"Success"}', marker: 'status: Success' },
    {
      name: 'text (v1 to v3)',
      error: 'error executing command: not found\n',
      marker: 'error: error executing command: not found',
    },
  ])('marks the error channel’s $name', async ({ error, marker }) => {
    const recorder = await newRecorder(options());
    recorder.event('error', Buffer.from(error));
    await recorder.close();
    const [, ...events] = await lines();
    expect(events).toEqual([[0, 'm', marker]]);
  });

  it('keeps times from running backwards when the clock is set back', async () => {
    const recorder = await newRecorder(options());
    clock.advance(5000);
    out(recorder, 'a');
    clock.advance(-3000);
    out(recorder, 'b');
    clock.advance(4000);
    out(recorder, 'c');
    await recorder.close();
    const [, ...events] = await lines();
    expect(events).toEqual([
      [5, 'o', 'a'],
      [5, 'o', 'b'],
      [6, 'o', 'c'],
    ]);
  });

  it('ends with a marker once the file would pass maxBytes, and never passes it', async () => {
    const maxBytes = 1000;
    const recorder = await newRecorder(options({ maxBytes }));
    for (let i = 0; i < 100; i++) {
      clock.advance(100);
      out(recorder, `line ${i}\r\n`);
    }
    expect(recorder.truncated).toBe(true);
    await recorder.close('session closed');
    const file = join(dir, 'session.cast');
    const size = (await stat(file)).size;
    expect(size).toBeLessThanOrEqual(maxBytes);
    expect(recorder.bytes).toBe(size);
    const events = (await lines()).slice(1) as [number, string, string][];
    expect(events.at(-1)).toEqual([expect.any(Number), 'm', 'recording truncated: size limit reached']);
    // Every line before the marker is output, in order, and nothing came after it (not even close's reason).
    const output = events.slice(0, -1);
    expect(output.length).toBeGreaterThan(5);
    expect(output.map(([, code, data]) => [code, data])).toEqual(
      output.map((_, i) => ['o', `line ${i}\r\n`]),
    );
  });

  it('ends with a marker when the disk falls so far behind that the queue would pass maxPendingBytes', async () => {
    const recorder = await newRecorder(options({ maxPendingBytes: 200 }));
    // Written at once, without yielding: the first line goes to the disk, the rest wait for it.
    for (let i = 0; i < 20; i++) out(recorder, `chunk ${i} ${'x'.repeat(20)}`);
    expect(recorder.truncated).toBe(true);
    await recorder.close();
    const events = (await lines()).slice(1) as [number, string, string][];
    expect(events.at(-1)).toEqual([0, 'm', 'recording truncated: writes fell behind the session']);
    expect(events.length).toBeLessThan(20);
    expect(events.slice(0, -1).map(([, , data]) => data)).toEqual(
      events.slice(0, -1).map((_, i) => `chunk ${i} ${'x'.repeat(20)}`),
    );
  });

  it('ignores events after close, and closes once', async () => {
    const recorder = await newRecorder(options());
    out(recorder, 'before');
    const closing = recorder.close('first');
    out(recorder, 'after');
    await Promise.all([closing, recorder.close('second')]);
    const [, ...events] = await lines();
    expect(events).toEqual([
      [0, 'o', 'before'],
      [0, 'm', 'first'],
    ]);
  });

  it('never writes through an existing file', async () => {
    const path = join(dir, 'taken.cast');
    await writeFile(path, 'someone else’s');
    await expect(newRecorder(options({ path }))).rejects.toMatchObject({ code: RECORDING_CREATE });
    expect(await readFile(path, 'utf8')).toBe('someone else’s');
  });

  it('rejects a file it cannot create', async () => {
    await expect(newRecorder(options({ path: join(dir, 'missing', 'x.cast') }))).rejects.toMatchObject({
      code: RECORDING_CREATE,
    });
  });

  it.each([
    { name: 'maxBytes of 0', overrides: { maxBytes: 0 } },
    { name: 'fractional maxBytes', overrides: { maxBytes: 1.5 } },
    { name: 'maxBytes smaller than the header and its marker', overrides: { maxBytes: 150 } },
    { name: 'maxPendingBytes of 0', overrides: { maxPendingBytes: 0 } },
    { name: 'a width of 0', overrides: { header: { width: 0 } } },
  ])('refuses $name before creating anything', async ({ overrides }) => {
    const path = join(dir, 'refused.cast');
    await expect(newRecorder(options({ path, ...overrides }))).rejects.toMatchObject({
      code: RECORDING_OPTIONS,
    });
    await expect(stat(path)).rejects.toMatchObject({ code: 'ENOENT' });
  });
});
