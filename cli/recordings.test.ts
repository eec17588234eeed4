import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { HttpsError } from '../lib/https-client.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import {
  listNotes,
  listOutput,
  listQuery,
  parseRecordingList,
  parseSince,
  recordingsCommand,
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

  it.each([
    ['{"items":', 'not JSON'],
    ['[]', 'not an object'],
    ['{"metadata":[]}', 'its metadata is not an object'],
    ['{"metadata":{"unreachableReplicas":"r-2"}}', 'its unreachableReplicas is not a list of names'],
    ['{"metadata":{"unreachableReplicas":[null]}}', 'its unreachableReplicas is not a list of names'],
    ['{"metadata":{"remainingItemCount":"many"}}', 'its remainingItemCount is not a number'],
    ['{"items":{}}', 'its items is not a list'],
    ['{"items":[null]}', 'an item without metadata and status'],
    ['{"items":[{"metadata":{"name":"x"}}]}', 'an item without metadata and status'],
    ['{"items":[{"metadata":{"name":7},"status":{}}]}', 'an item whose name is not a string'],
    [
      '{"items":[{"metadata":{"name":"x"},"status":{"user":{}}}]}',
      'an item whose status.user is not a string',
    ],
    [
      '{"items":[{"metadata":{"name":"x"},"status":{"bytes":"1"}}]}',
      'an item whose status.bytes is not a number',
    ],
    [
      '{"items":[{"metadata":{"name":"x"},"status":{"command":"ls"}}]}',
      'an item whose status.command is not a list of strings',
    ],
  ])('refuses the server answer %s in one line', (text, what) => {
    expect(() => parseRecordingList(text, 'proxy:443')).toThrow(
      `list recordings on proxy:443: the server's answer is not a SessionRecordingList (${what}); check that the kubeconfig's server is a Sealion proxy`,
    );
  });

  it('takes a list as the server answers it', () => {
    expect(parseRecordingList(JSON.stringify(LIST), 'proxy:443')).toEqual(LIST);
    expect(parseRecordingList('{}', 'proxy:443')).toEqual({});
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

describe('recordings list against a stand-in hub', () => {
  let server: Server;
  let dir: string;
  let host: string;
  /** The URLs the stand-in was asked, and what it answers next. */
  const asked: string[] = [];
  let answer: { status: number; body: object } = { status: 200, body: LIST };

  beforeAll(async () => {
    const ca = await newCA('recordings-test-ca');
    const cert = await issueCert(ca, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
    server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      asked.push(`${req.headers.authorization} ${req.url}`);
      res.writeHead(answer.status, { 'content-type': 'application/json' }).end(JSON.stringify(answer.body));
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
    dir = mkdtempSync(join(tmpdir(), 'sealion-recordings-cli-'));
    const caData = Buffer.from(ca.certPem).toString('base64');
    // The current context names nothing that answers: only --context reaches the stand-in, through a cluster's path.
    const cluster = (name: string, server: string) => ({
      name,
      cluster: { server, 'certificate-authority-data': caData },
    });
    const context = (name: string, cluster: string) => ({ name, context: { cluster, user: 'me' } });
    writeFileSync(
      join(dir, 'kubeconfig'),
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [
          cluster('nowhere', 'https://127.0.0.1:1'),
          cluster('edge', `https://${host}/clusters/edge`),
        ],
        contexts: [context('nowhere', 'nowhere'), context('sealion-edge', 'edge')],
        'current-context': 'nowhere',
        users: [{ name: 'me', user: { token: 'secret' } }],
      }),
    );
  });

  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((done) => server.close(() => done()));
    rmSync(dir, { recursive: true, force: true });
  });

  /** Runs `sealion recordings <args>`; what it wrote to stdout and stderr, or what it threw. */
  async function run(...args: string[]): Promise<{ stdout: string; stderr: string; error?: string }> {
    const out: string[] = [];
    const err: string[] = [];
    const stdout = jest
      .spyOn(process.stdout, 'write')
      .mockImplementation((chunk) => (out.push(String(chunk)), true));
    const stderr = jest
      .spyOn(process.stderr, 'write')
      .mockImplementation((chunk) => (err.push(String(chunk)), true));
    try {
      await recordingsCommand()
        .exitOverride()
        .parseAsync([...args, '--kubeconfig', join(dir, 'kubeconfig')], { from: 'user' });
      return { stdout: out.join(''), stderr: err.join('') };
    } catch (e) {
      return { stdout: out.join(''), stderr: err.join(''), error: (e as Error).message };
    } finally {
      stdout.mockRestore();
      stderr.mockRestore();
    }
  }

  it('asks the hub of the context --context names, with the filters, and prints the table and what it left out', async () => {
    asked.length = 0;
    answer = { status: 200, body: { ...LIST, metadata: { remainingItemCount: 3 } } };
    const r = await run(
      'list',
      '--context',
      'sealion-edge',
      '--user',
      'alice',
      '--cluster',
      'edge',
      '--limit',
      '3',
    );
    expect(r.error).toBeUndefined();
    expect(asked).toEqual([
      'Bearer secret /apis/recordings.concierge.sealion.dev/v1alpha1/sessionrecordings?user=alice&cluster=edge&limit=3',
    ]);
    expect(r.stdout).toBe(`${recordingsTable(LIST)}\n`);
    expect(r.stderr).toBe(
      'sealion: 3 more recordings match; narrow with --since, --user or --cluster, or raise --limit\n',
    );
  });

  it('fails in one line naming the server when its answer is no SessionRecordingList', async () => {
    answer = { status: 200, body: { metadata: { unreachableReplicas: 'sealion-concierge-2' }, items: [] } };
    const r = await run('list', '--context', 'sealion-edge');
    expect(r.stdout).toBe('');
    expect(r.error).toBe(
      `list recordings on ${host}: the server's answer is not a SessionRecordingList (its unreachableReplicas is not a list of names); check that the kubeconfig's server is a Sealion proxy`,
    );
  });

  it('prints -o yaml as the list itself', async () => {
    answer = { status: 200, body: LIST };
    const r = await run('list', '--context', 'sealion-edge', '-o', 'yaml');
    expect(parse(r.stdout)).toEqual(LIST);
  });

  it('fails in one line that says where and what to do when the hub refuses', async () => {
    answer = {
      status: 403,
      body: {
        kind: 'Status',
        status: 'Failure',
        message: 'sessionrecordings.recordings.concierge.sealion.dev is forbidden: User "me" cannot list it',
        code: 403,
      },
    };
    const r = await run('list', '--context', 'sealion-edge');
    expect(r.error).toBe(
      `list recordings on ${host}: HTTP 403: sessionrecordings.recordings.concierge.sealion.dev is forbidden: User "me" cannot list it; ask an admin to bind you the ClusterRole sealion-concierge-session-auditor`,
    );
  });
});
