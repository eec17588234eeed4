import { describe, expect, it } from '@jest/globals';
import { parse } from 'yaml';
import { HttpsError } from '../lib/https-client.ts';
import {
  listNotes,
  listOutput,
  listQuery,
  parseSince,
  recordingsFailure,
  recordingsTable,
  shortDuration,
  shortSize,
  type SessionRecordingList,
} from './recordings.ts';

/** 2026-11-28T12:00:00Z. */
const NOW = Date.parse('2026-11-28T12:00:00Z');

const LIST: SessionRecordingList = {
  apiVersion: 'recordings.concierge.sealion.dev/v1alpha1',
  kind: 'SessionRecordingList',
  metadata: {},
  items: [
    {
      metadata: {
        name: '6f1c2a9e-0d4b-4c1e-9a57-3f2f5f7c9e11',
        creationTimestamp: '2026-11-28T11:58:00.000Z',
      },
      status: {
        replica: 'sealion-concierge-0',
        bytes: 2_450,
        kind: 'sftp',
        user: 'alice@example.com',
        cluster: 'edge',
        namespace: 'shop',
        pod: 'web-5d7a',
        container: 'app',
        startTime: '2026-11-28T11:58:00.000Z',
        lastWriteTime: '2026-11-28T11:58:42.000Z',
      },
    },
    {
      metadata: {
        name: '0b8f0c1e-5d7a-4c1e-9a57-3f2f5f7c9e11',
        creationTimestamp: '2026-11-28T09:00:00.000Z',
      },
      status: {
        replica: 'sealion-concierge-1',
        bytes: 3_500_000,
        kind: 'exec',
        user: 'bob',
        cluster: 'hub',
        namespace: 'default',
        pod: 'demo',
        command: ['sh', '-c', 'tail -f /var/log/app.log | grep --line-buffered error'],
        startTime: '2026-11-28T09:00:00.000Z',
        lastWriteTime: '2026-11-28T10:05:30.000Z',
      },
    },
    {
      metadata: {
        name: '11111111-2222-4333-8444-555555555555',
        creationTimestamp: '2026-11-27T08:00:00.000Z',
      },
      status: { replica: 'sealion-concierge-1', bytes: 300 },
    },
  ],
} as SessionRecordingList;

describe('recordings list', () => {
  it('shows who ran what where, when and for how long, one row a session', () => {
    expect(recordingsTable(LIST)).toBe(
      [
        'ID                                    USER               CLUSTER  NAMESPACE/POD  COMMAND                                      STARTED               DURATION  SIZE',
        '6f1c2a9e-0d4b-4c1e-9a57-3f2f5f7c9e11  alice@example.com  edge     shop/web-5d7a  (sftp)                                       2026-11-28T11:58:00Z  42s       2.4KiB',
        '0b8f0c1e-5d7a-4c1e-9a57-3f2f5f7c9e11  bob                hub      default/demo   sh -c tail -f /var/log/app.log | grep --...  2026-11-28T09:00:00Z  1h5m      3.3MiB',
        '11111111-2222-4333-8444-555555555555  <none>             <none>   <none>         <none>                                       <none>                <none>    300B',
      ].join('\n'),
    );
  });

  it('shows what a user or command chose as text, never as terminal control', () => {
    const table = recordingsTable({
      items: [
        {
          metadata: { name: 'x' },
          status: { user: 'eve\u001b]0;owned\u0007', kind: 'exec', command: ['printf', '\u009b2J'] },
        },
      ],
    });
    expect(table.split('\n')[1]).toBe(
      'x   eve\\u001b]0;owned\\u0007  <none>   <none>         printf \\u009b2J  <none>   <none>    <none>',
    );
  });

  it('says on stderr what the list left out, and what to do', () => {
    expect(
      listNotes({
        metadata: { remainingItemCount: 1200, unreachableReplicas: ['sealion-concierge-2'] },
        items: [],
      }),
    ).toEqual([
      '1200 more recordings match; narrow with --since, --user or --cluster, or raise --limit',
      'replicas that did not answer: sealion-concierge-2; their recordings are not listed, retry later',
    ]);
    expect(listNotes(LIST)).toEqual([]);
  });

  it('prints the SessionRecordingList itself with -o json and -o yaml', async () => {
    expect(JSON.parse(await listOutput(LIST, 'json'))).toEqual(LIST);
    const yaml = await listOutput(LIST, 'yaml');
    expect(parse(yaml)).toEqual(LIST);
    expect(yaml).toContain('kind: SessionRecordingList\n');
    // A C1 control stays an escape in YAML too.
    const tricky = await listOutput(
      { items: [{ metadata: { name: 'x' }, status: { user: 'a\u009bb' } }] },
      'yaml',
    );
    expect(tricky).not.toMatch(/\u009b/);
    expect(parse(tricky)).toEqual({ items: [{ metadata: { name: 'x' }, status: { user: 'a\u009bb' } }] });
  });

  it('asks the server to filter: user, cluster, since (a duration or an RFC 3339 time) and limit', () => {
    expect(listQuery({}, NOW)).toBe('');
    expect(listQuery({ user: 'alice@example.com', cluster: 'hub', since: '2h', limit: '50' }, NOW)).toBe(
      '?user=alice%40example.com&cluster=hub&since=2026-11-28T10%3A00%3A00.000Z&limit=50',
    );
    expect(listQuery({ since: '2026-11-28T09:00:00+01:00' }, NOW)).toBe(
      '?since=2026-11-28T08%3A00%3A00.000Z',
    );
    expect(parseSince('1h30m', NOW)).toBe(NOW - 90 * 60_000);
    expect(parseSince('7d', NOW)).toBe(NOW - 7 * 86_400_000);
  });

  it('refuses a --since or --limit it cannot read before anything starts, saying what to give', () => {
    expect(() => listQuery({ since: 'yesterday' }, NOW)).toThrow(
      'recordings list --since "yesterday": not a duration or an RFC 3339 time; give one such as 2h, 7d or 2026-11-28T09:00:00Z',
    );
    expect(() => listQuery({ since: '2026-11-28 09:00' }, NOW)).toThrow(
      'recordings list --since "2026-11-28 09:00": not a duration or an RFC 3339 time; give one such as 2h, 7d or 2026-11-28T09:00:00Z',
    );
    expect(() => listQuery({ limit: '0' }, NOW)).toThrow(
      'recordings list --limit "0": not a positive whole number; give one such as 100',
    );
  });

  it('says in one line what failed, where, and what to do', async () => {
    const refused = new HttpsError('BadStatus', 'HTTP 403', 403);
    refused.body = JSON.stringify({
      kind: 'Status',
      status: 'Failure',
      message: 'sessionrecordings.recordings.concierge.sealion.dev is forbidden: User "bob" cannot list it',
      code: 403,
    });
    expect((await recordingsFailure(refused, 'list recordings', 'proxy.example:443')).message).toBe(
      'list recordings on proxy.example:443: HTTP 403: sessionrecordings.recordings.concierge.sealion.dev is forbidden: User "bob" cannot list it; ask an admin to bind you the ClusterRole sealion-concierge-session-auditor',
    );
    const missing = new HttpsError('BadStatus', 'HTTP 404', 404);
    expect((await recordingsFailure(missing, 'get recording x', 'proxy.example:443')).message).toBe(
      'get recording x on proxy.example:443: HTTP 404; see sealion recordings list for the IDs there are',
    );
  });

  it('shows durations and sizes as kubectl shows ages', () => {
    expect([0, 45_000, 192_000, 3_600_000, 7_530_000, 90_000_000].map(shortDuration)).toEqual([
      '0s',
      '45s',
      '3m12s',
      '1h',
      '2h5m',
      '1d1h',
    ]);
    expect([0, 1023, 1024, 1536, 10 * 1024 * 1024, 33_554_432].map(shortSize)).toEqual([
      '0B',
      '1023B',
      '1KiB',
      '1.5KiB',
      '10MiB',
      '32MiB',
    ]);
  });
});
