import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import type { IncomingMessage } from 'node:http';
import { mkdtemp, readFile, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { silentLogger } from '../../lib/log.ts';
import { fakeClock, type FakeClock } from '../../test-support/fake-clock.ts';
import { parseFilterQuery, selectRecordings, type RecordingInfo } from './listing.ts';
import { parseAsciicast } from './playback.ts';
import { newRecordings, sharedRecordings, type Recordings, type SessionFacts } from './session.ts';

/** 2023-11-14T22:13:20Z. */
const START = 1_700_000_000_000;
const ID = (n: number): string => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;

let dir: string;
let clock: FakeClock;
let hubName: string;
let recordings: Recordings;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sealion-recordings-'));
  clock = fakeClock();
  clock.advance(START);
  hubName = 'hub';
  recordings = newRecordings({ dir, clock, log: silentLogger(), hubName: () => hubName });
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function session(n: number, overrides: Partial<SessionFacts> = {}): SessionFacts {
  return {
    auditID: ID(n),
    user: 'alice',
    cluster: '',
    namespace: 'default',
    pod: 'web',
    subresource: 'exec',
    query: new URLSearchParams('command=sh&command=-c&command=date&container=app'),
    ...overrides,
  };
}

/** Opens and closes a session's recording that started `at` ms after START; it counts as having run. */
async function recorded(n: number, at: number, overrides: Partial<SessionFacts> = {}): Promise<void> {
  clock.advance(at - (clock.now() - START));
  const recording = await recordings.open(session(n, overrides));
  // The upstream's 101: a recording of a session that never switched protocols is removed at close.
  const switched = { headers: { upgrade: 'websocket', 'sec-websocket-protocol': 'v5.channel.k8s.io' } };
  expect(recording.tap(switched as unknown as IncomingMessage, () => {})).not.toBeInstanceOf(Error);
  await recording.close();
}

describe('the list of recordings', () => {
  it("names each session's user, cluster, pod, command and start, and the hub by the config's name", async () => {
    await recorded(1, 0);
    await recorded(2, 5_000, {
      cluster: 'edge',
      user: 'bob',
      subresource: 'attach',
      query: new URLSearchParams(),
    });
    const page = await recordings.list();
    expect(page.remaining).toBe(0);
    expect(page.items.map(({ modified: _m, bytes: _b, ...facts }) => facts)).toEqual([
      {
        id: ID(2),
        kind: 'attach',
        user: 'bob',
        cluster: 'edge',
        namespace: 'default',
        pod: 'web',
        started: '2023-11-14T22:13:25.000Z',
      },
      {
        id: ID(1),
        kind: 'exec',
        user: 'alice',
        cluster: 'hub',
        namespace: 'default',
        pod: 'web',
        container: 'app',
        command: ['sh', '-c', 'date'],
        started: '2023-11-14T22:13:20.000Z',
      },
    ]);
    // The header itself names the hub, for whoever reads the file.
    const header = parseAsciicast(await readFile(join(dir, `${ID(1)}.cast`), 'utf8')).header;
    expect(header.sealion).toMatchObject({ cluster: 'hub', kind: 'exec', auditID: ID(1) });
  });

  it('names the hub of a recording made before its header named it (cluster "") as the config does now', async () => {
    const header = { version: 2, width: 80, height: 24, timestamp: 1_700_000_000, title: 'exec default/web' };
    await writeFile(
      join(dir, `${ID(7)}.cast`),
      `${JSON.stringify({ ...header, sealion: { auditID: ID(7), user: 'alice', cluster: '', namespace: 'default', pod: 'web', command: ['ls'] } })}\n`,
    );
    hubName = 'central';
    const [item] = (await recordings.list()).items;
    expect(item).toMatchObject({ id: ID(7), kind: 'exec', cluster: 'central', command: ['ls'] });
  });

  it('filters by user, cluster and start, newest first, and says how many more matched past the limit', async () => {
    await recorded(1, 0);
    await recorded(2, 60_000, { cluster: 'edge' });
    await recorded(3, 120_000, { user: 'bob' });
    await recorded(4, 180_000);
    const ids = async (query: string): Promise<string[]> => {
      const filter = parseFilterQuery(new URLSearchParams(query));
      if ('problem' in filter) throw new Error(filter.problem);
      return (await recordings.list(filter)).items.map((r) => r.id);
    };
    expect(await ids('')).toEqual([ID(4), ID(3), ID(2), ID(1)]);
    expect(await ids('user=alice')).toEqual([ID(4), ID(2), ID(1)]);
    expect(await ids('cluster=hub')).toEqual([ID(4), ID(3), ID(1)]);
    expect(await ids('cluster=edge')).toEqual([ID(2)]);
    expect(await ids('since=2023-11-14T22:14:20Z')).toEqual([ID(4), ID(3), ID(2)]);
    expect(await ids('user=alice&cluster=hub&since=2023-11-14T23:14:20%2B01:00')).toEqual([ID(4)]);
    expect(await recordings.list({ limit: 2 })).toMatchObject({
      items: [{ id: ID(4) }, { id: ID(3) }],
      remaining: 2,
    });
  });

  it('reads each header once: a file rewritten under the same name keeps the facts first read', async () => {
    await recorded(1, 0);
    expect((await recordings.list()).items[0]!.user).toBe('alice');
    const path = join(dir, `${ID(1)}.cast`);
    const text = await readFile(path, 'utf8');
    await writeFile(path, text.replace('"alice"', '"mallory"'));
    expect((await recordings.list()).items[0]!.user).toBe('alice');
  });

  it('lists a file without a readable header by its size and time alone', async () => {
    await writeFile(join(dir, `${ID(9)}.cast`), 'not json\n');
    await utimes(join(dir, `${ID(9)}.cast`), START / 1000, START / 1000);
    expect((await recordings.list()).items).toEqual([
      { id: ID(9), bytes: 9, modified: '2023-11-14T22:13:20.000Z' },
    ]);
  });

  it('refuses a query it cannot read, with what is wrong', () => {
    expect(parseFilterQuery(new URLSearchParams('since=yesterday'))).toEqual({
      problem: 'since: "yesterday" is not an RFC 3339 time',
    });
    expect(parseFilterQuery(new URLSearchParams('since=2023-11-14T22:14:20'))).toEqual({
      problem: 'since: "2023-11-14T22:14:20" is not an RFC 3339 time',
    });
    expect(parseFilterQuery(new URLSearchParams('limit=0'))).toEqual({
      problem: 'limit: "0" is not a positive integer',
    });
    expect(parseFilterQuery(new URLSearchParams('limit=999999'))).toEqual({ limit: 5000 });
  });
});

describe("every replica's recordings", () => {
  it("merges the peers' lists, newest first, cut to the limit again, with what each left out", async () => {
    await recorded(1, 0);
    await recorded(3, 2_000);
    const peer = (n: number, at: number): RecordingInfo & { replica: string } => ({
      id: ID(n),
      bytes: 10,
      modified: new Date(START + at).toISOString(),
      started: new Date(START + at).toISOString(),
      user: 'carol',
      replica: 'b',
    });
    const asked: unknown[] = [];
    const store = sharedRecordings(recordings, 'a', () => ({
      peerRecordings: async (filter) => {
        asked.push(filter);
        return { found: [peer(2, 1_000), peer(4, 3_000)], remaining: 5, unreachable: ['c'] };
      },
      peerRecording: async () => undefined,
    }));
    const page = await store.list({ limit: 3 });
    expect(asked).toEqual([{ limit: 3 }]);
    expect(page.found.map((r) => [r.id, r.replica])).toEqual([
      [ID(4), 'b'],
      [ID(3), 'a'],
      [ID(2), 'b'],
    ]);
    expect(page.remaining).toBe(6);
    expect(page.unreachable).toEqual(['c']);
    // A replica from before filtered lists answers all it holds: what the filter does not name is left out here.
    const filtered = await store.list({ user: 'carol', limit: 3 });
    expect(filtered.found.map((r) => [r.id, r.user])).toEqual([
      [ID(4), 'carol'],
      [ID(2), 'carol'],
    ]);
    expect((await store.list({ user: 'dave' })).found).toEqual([]);
  });
});

describe('reading one recording', () => {
  it('asks the peers for a recording name only, never for a path or any other string a client sends', async () => {
    const asked: string[] = [];
    const store = sharedRecordings(recordings, 'a', () => ({
      peerRecordings: async () => ({ found: [], remaining: 0, unreachable: [] }),
      peerRecording: async (id) => {
        asked.push(id);
        return undefined;
      },
    }));
    for (const id of ['../etc/passwd', ':'.repeat(30_000), `${ID(9)}.cast`, `${ID(9).slice(0, -1)}G`, ''])
      expect(await store.read(id)).toBeUndefined();
    expect(asked).toEqual([]);
    expect(await store.read(ID(9))).toBeUndefined();
    expect(asked).toEqual([ID(9)]);
  });
});

describe('a session recorded operation by operation (sftp)', () => {
  it('is one recording: opened by its first operation, each operation a line, listed as sftp', async () => {
    const ops = recordings.openOperations({ user: 'alice', kind: 'sftp' });
    expect(ops.opened()).toBeUndefined();
    const place = { cluster: 'edge', namespace: 'default', pod: 'web', container: 'app' };
    ops.note(place, 'stat /edge/default/web/app/tmp/x');
    const id = await ops.opened();
    ops.note(place, 'write /edge/default/web/app/tmp/x flags=ct');
    ops.note({ ...place, pod: 'db' }, 'read /edge/default/db/app/etc/hosts');
    await ops.close();
    ops.note(place, 'after the end');
    const text = await readFile(join(dir, `${id}.cast`), 'utf8');
    const cast = parseAsciicast(text);
    expect(cast.header).toMatchObject({
      title: 'sftp default/web',
      sealion: {
        kind: 'sftp',
        user: 'alice',
        cluster: 'edge',
        namespace: 'default',
        pod: 'web',
        container: 'app',
      },
    });
    expect(cast.events.map((e) => e[2])).toEqual([
      'stat /edge/default/web/app/tmp/x\r\n',
      'write /edge/default/web/app/tmp/x flags=ct\r\n',
      'read /edge/default/db/app/etc/hosts\r\n',
    ]);
    expect((await recordings.list()).items).toMatchObject([
      { id, kind: 'sftp', user: 'alice', cluster: 'edge' },
    ]);
  });

  it('records nothing for a session that ran no command', async () => {
    const ops = recordings.openOperations({ user: 'alice', kind: 'sftp' });
    await ops.close();
    expect((await recordings.list()).items).toEqual([]);
  });
});

describe('selectRecordings', () => {
  it('orders a recording without a start by its last write', () => {
    const page = selectRecordings([
      { id: 'a', bytes: 1, modified: '2023-11-14T22:13:30.000Z' },
      { id: 'b', bytes: 1, modified: '2023-11-14T22:13:40.000Z', started: '2023-11-14T22:13:10.000Z' },
    ]);
    expect(page.items.map((r) => r.id)).toEqual(['a', 'b']);
  });
});
