// `sealion request`, `whoami` and `clusters` with access requests: the flags checked before any call, the table, the
// wait's outcomes on a fake clock, and the commands run against a local HTTPS server standing in for the proxy (which
// records what each command sent, and where: always the hub's URL, never a cluster's).
import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Command } from 'commander';
import { parse } from 'yaml';
import type { AccessRequest } from '../apis/access.ts';
import { HttpsError } from '../lib/https-client.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { clustersCommand, clustersTable } from './clusters.ts';
import { lookupNames } from './completion.ts';
import { UserError } from './errors.ts';
import {
  NOT_FOUND_GRACE_MS,
  parseAnswer,
  parseDuration,
  phaseAt,
  requestCommand,
  requestsTable,
  requestToCreate,
  waitFor,
  type CreateFlags,
  type WaitDeps,
} from './request.ts';
import { whoamiCommand, whoamiOutput } from './whoami.ts';

const NOW = Date.parse('2026-11-29T12:00:00Z');
const GROUP = 'access.concierge.sealion.dev';
const PREFIX = `/apis/${GROUP}/v1alpha1`;

/** An AccessRequest as the server answers it. */
function request(name: string, phase: string, more: Partial<AccessRequest['status']> = {}): AccessRequest {
  return {
    apiVersion: `${GROUP}/v1alpha1`,
    kind: 'AccessRequest',
    metadata: { name, creationTimestamp: '2026-11-29T11:50:00Z' },
    spec: {
      clusters: ['edge'],
      groups: ['oncall-admins'],
      durationSeconds: 3600,
      reason: 'INC-123: restart payments',
      requester: { username: 'alice' },
    },
    status: {
      phase: phase as 'Pending',
      approvalsRequired: 1,
      expiresAt: new Date(NOW + 45 * 60_000).toISOString(),
      requester: 'alice',
      ...more,
    },
  };
}

const createFlags = (more: Partial<CreateFlags> = {}): CreateFlags => ({
  kubeconfig: '',
  context: '',
  groupSuffix: 'sealion.dev',
  output: 'table',
  cluster: ['edge', 'hub', 'edge'],
  group: ['oncall-admins'],
  duration: '1h30m',
  reason: 'INC-123',
  wait: false,
  timeout: '10m',
  ...more,
});

describe('request create checks every flag before any call', () => {
  it('builds the AccessRequest, each cluster once, and claims no requester', () => {
    expect(requestToCreate(createFlags({ name: 'inc-123' }))).toEqual({
      apiVersion: `${GROUP}/v1alpha1`,
      kind: 'AccessRequest',
      metadata: { name: 'inc-123' },
      spec: {
        clusters: ['edge', 'hub'],
        groups: ['oncall-admins'],
        durationSeconds: 5400,
        reason: 'INC-123',
      },
    });
  });

  it.each([
    [{ cluster: [] }, 'request create: no cluster named; pass --cluster NAME'],
    [{ cluster: ['Edge'] }, 'request create --cluster "Edge": not a cluster name (a DNS label)'],
    [
      { cluster: Array.from({ length: 17 }, (_, i) => `c${i}`) },
      'request create: 17 clusters; name at most 16',
    ],
    [{ group: [] }, 'request create: no group named; pass --group NAME'],
    [{ group: ['  '] }, 'request create --group "  ": is empty; give a group name'],
    [
      { group: ['a\u001b[2Jb'] },
      'request create --group "a\\u001b[2Jb": holds a control or invisible character',
    ],
    [
      { duration: 'an hour' },
      'request create --duration "an hour": not a duration; give one such as 30m, 1h or 1h30m',
    ],
    [{ duration: '30s' }, 'request create --duration 30s: must be between 1m and 7d'],
    [{ duration: '8d' }, 'request create --duration 8d: must be between 1m and 7d'],
    [{ reason: '' }, 'request create --reason: must not be empty; say why in one line'],
    [{ reason: 'a\nb' }, 'request create --reason: must not contain control characters'],
    [{ name: 'Not_A_Name' }, '"Not_A_Name" is not an access request name'],
  ])('refuses %j', (more, message) => {
    expect(() => requestToCreate(createFlags(more as Partial<CreateFlags>))).toThrow(UserError);
    expect(() => requestToCreate(createFlags(more as Partial<CreateFlags>))).toThrow(message);
  });

  it('reads durations as whole units added', () => {
    expect(parseDuration('90s', 'x', 1, 1e9)).toBe(90);
    expect(parseDuration('2d3h4m5s', 'x', 1, 1e9)).toBe(2 * 86400 + 3 * 3600 + 4 * 60 + 5);
    expect(() => parseDuration('1.5h', 'x', 1, 1e9)).toThrow('not a duration');
    expect(() => parseDuration('-1h', 'x', 1, 1e9)).toThrow('not a duration');
  });
});

describe('the table', () => {
  it('shows each request, what it asks, its phase by the clock, and when it ends', () => {
    const rows = [
      request('alice-1', 'Approved', {
        reviews: [{ user: 'bob', decision: 'Approved', time: '2026-11-29T11:55:00Z' }],
      }),
      request('alice-2', 'Pending', { expiresAt: new Date(NOW - 1000).toISOString() }),
      {
        ...request('alice-3', 'Denied'),
        spec: { ...request('x', 'y').spec, reason: 'eve\u001b]0;owned\u0007' },
      },
    ];
    expect(requestsTable(rows, NOW, true)).toBe(
      [
        'NAME      REQUESTER   CLUSTERS   GROUPS          DURATION   PHASE      APPROVALS   ENDS     REASON',
        'alice-1   alice       edge       oncall-admins   1h         Approved   1/1         in 45m   INC-123: restart payments',
        'alice-2   alice       edge       oncall-admins   1h         Expired    0/1         <none>   INC-123: restart payments',
        'alice-3   alice       edge       oncall-admins   1h         Denied     0/1         <none>   eve\\u001b]0;owned\\u0007',
        '',
      ].join('\n'),
    );
    expect(phaseAt(request('x', 'Approved', { expiresAt: new Date(NOW).toISOString() }), NOW)).toBe(
      'Expired',
    );
  });

  it('refuses an answer that is not an AccessRequest, saying what is wrong and what to check', () => {
    expect(() => parseAnswer('{"items":[{"metadata":{}}]}', 'hub.example', true)).toThrow(
      "the answer of hub.example is not an AccessRequestList (an item with an object without metadata and spec); check that the kubeconfig's server is a Sealion proxy that serves access requests",
    );
    expect(() => parseAnswer('<html>', 'hub.example', false)).toThrow('(not JSON)');
  });
});

describe('waitFor', () => {
  /** A fake clock that moves only when the wait sleeps, and the answers each poll gets. */
  function deps(answers: (now: number) => AccessRequest[] | Error): WaitDeps & { polls: number } {
    let now = NOW;
    const d = {
      polls: 0,
      now: () => now,
      sleep: (ms: number) => {
        now += ms;
        return Promise.resolve();
      },
      fetch: () => {
        d.polls++;
        const answer = answers(now);
        return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer);
      },
    };
    return d;
  }

  it('answers the request once it is approved', async () => {
    const d = deps((now) => [request('r', now >= NOW + 6_000 ? 'Approved' : 'Pending')]);
    expect((await waitFor('r', 600_000, d)).status?.phase).toBe('Approved');
    expect(d.polls).toBe(4);
  });

  it.each([
    [
      'Denied',
      { reviews: [{ user: 'bob', decision: 'Denied' as const, reason: 'use the runbook', time: '' }] },
      'access request r was denied by bob (use the runbook); ask again with sealion request create if the need remains',
    ],
    ['Withdrawn', {}, 'access request r was withdrawn'],
    ['Expired', {}, 'access request r has expired undecided; ask again with sealion request create'],
    [
      'Approved',
      { approvedAt: '2026-11-29T10:00:00Z', expiresAt: '2026-11-29T11:00:00Z' },
      'access request r has expired: its grant ended',
    ],
  ])('fails in one line when it is %s', async (phase, more, message) => {
    await expect(
      waitFor(
        'r',
        600_000,
        deps(() => [request('r', phase, more)]),
      ),
    ).rejects.toThrow(message);
  });

  it('gives a request not seen yet a few seconds, then says it is none of yours', async () => {
    const d = deps(() => []);
    await expect(waitFor('r', 600_000, d)).rejects.toThrow(
      'you have no access request r; see sealion request list for yours',
    );
    expect(d.now() - NOW).toBeGreaterThanOrEqual(NOT_FOUND_GRACE_MS);
  });

  it('retries passing trouble until the timeout, and says what to do then', async () => {
    const d = deps(() => new HttpsError('BadStatus', 'HTTP 503', 503));
    await expect(waitFor('r', 60_000, d)).rejects.toThrow(
      'access request r is still not approved after 1m (the last try: HTTP 503); run sealion request wait r again, or ask a reviewer to run sealion request approve r',
    );
    expect(d.now() - NOW).toBe(60_000);
  });

  it('stops at a refusal', async () => {
    const refused = new HttpsError('BadStatus', 'HTTP 403', 403);
    await expect(
      waitFor(
        'r',
        60_000,
        deps(() => refused),
      ),
    ).rejects.toBe(refused);
  });
});

/**
 * A request as the server answers it now: the CLI reads it against the real clock, so its end is 45 minutes from
 * now, not from NOW.
 */
function live(name: string, phase: string, more: Partial<AccessRequest['status']> = {}): AccessRequest {
  return request(name, phase, { expiresAt: new Date(Date.now() + 45 * 60_000).toISOString(), ...more });
}

describe('against a proxy', () => {
  let dir: string;
  let server: Server;
  let url: string;
  let kubeconfig: string;
  /** What the server got: method, path, body. */
  let got: { method: string; path: string; body: unknown; authorization?: string }[] = [];
  /** The server's answers by `METHOD path`: a status and a body. */
  let answers: Record<string, [number, unknown]> = {};
  let out: string;
  let err: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-request-'));
    const ca = await newCA('request-ca');
    const cert = await issueCert(ca, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
    server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      let text = '';
      req.setEncoding('utf8').on('data', (chunk: string) => (text += chunk));
      req.on('end', () => {
        const path = (req.url ?? '').split('?')[0]!;
        got.push({
          method: req.method!,
          path,
          body: text ? (JSON.parse(text) as unknown) : undefined,
          authorization: req.headers.authorization,
        });
        const [status, body] = answers[`${req.method} ${path}`] ?? [
          404,
          { kind: 'Status', apiVersion: 'v1', status: 'Failure', message: 'not found', code: 404 },
        ];
        res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
      });
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
    kubeconfig = join(dir, 'me.kubeconfig');
    const caData = Buffer.from(ca.certPem).toString('base64');
    // The current context reaches an agent-backed cluster through the proxy: the commands must go to the hub.
    writeFileSync(
      kubeconfig,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: ['edge', 'hub'].map((name) => ({
          name,
          cluster: {
            server: name === 'hub' ? url : `${url}/clusters/${name}`,
            'certificate-authority-data': caData,
          },
        })),
        users: [{ name: 'me', user: { token: 'alice-token' } }],
        contexts: ['edge', 'hub'].map((name) => ({ name, context: { cluster: name, user: 'me' } })),
        'current-context': 'edge',
      }),
    );
  });

  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((done) => server.close(done));
    rmSync(dir, { recursive: true, force: true });
  });

  /** Runs one command in this process, its standard output and error captured. */
  async function run(command: Command, args: string[]): Promise<void> {
    out = '';
    err = '';
    got = [];
    const stdout = jest.spyOn(process.stdout, 'write').mockImplementation((chunk) => {
      out += String(chunk);
      return true;
    });
    const stderr = jest.spyOn(process.stderr, 'write').mockImplementation((chunk) => {
      err += String(chunk);
      return true;
    });
    try {
      await command.exitOverride().parseAsync(['node', 'sealion', ...args, '--kubeconfig', kubeconfig]);
    } finally {
      stdout.mockRestore();
      stderr.mockRestore();
    }
  }

  afterEach(() => {
    answers = {};
  });

  it('create posts the request to the hub, prints its row and what to do next', async () => {
    answers = { [`POST ${PREFIX}/accessrequests`]: [201, live('alice-x7k2p', 'Pending')] };
    await run(requestCommand(), [
      'create',
      '--cluster',
      'edge',
      '--group',
      'oncall-admins',
      '--duration',
      '1h',
      '--reason',
      'INC-123: restart payments',
    ]);
    expect(got).toEqual([
      {
        method: 'POST',
        path: `${PREFIX}/accessrequests`,
        authorization: 'Bearer alice-token',
        body: {
          apiVersion: `${GROUP}/v1alpha1`,
          kind: 'AccessRequest',
          metadata: {},
          spec: {
            clusters: ['edge'],
            groups: ['oncall-admins'],
            durationSeconds: 3600,
            reason: 'INC-123: restart payments',
          },
        },
      },
    ]);
    expect(out).toMatch(/^NAME +CLUSTERS .*\nalice-x7k2p +edge +oncall-admins +1h +Pending +0\/1 /);
    expect(err).toBe('sealion: ask a reviewer to run: sealion request approve alice-x7k2p\n');
  });

  it('create makes no call when a flag is wrong', async () => {
    await expect(
      run(requestCommand(), [
        'create',
        '--cluster',
        'edge',
        '--group',
        'g',
        '--duration',
        '9d',
        '--reason',
        'x',
      ]),
    ).rejects.toThrow('request create --duration 9d: must be between 1m and 7d');
    expect(got).toEqual([]);
  });

  it("create says the server's refusal in one line, with what to do", async () => {
    answers = {
      [`POST ${PREFIX}/accessrequests`]: [
        429,
        { kind: 'Status', status: 'Failure', message: 'alice has 10 pending access requests', code: 429 },
      ],
    };
    await expect(
      run(requestCommand(), ['create', '--cluster', 'edge', '--group', 'g', '--reason', 'x']),
    ).rejects.toThrow(
      `cannot create the access request on ${url}: HTTP 429: alice has 10 pending access requests; you have too many pending requests; withdraw one (sealion request withdraw NAME) or wait for its review`,
    );
  });

  it('create --wait waits for the approval and prints the approved request', async () => {
    answers = {
      [`POST ${PREFIX}/accessrequests`]: [201, live('alice-x7k2p', 'Pending')],
      [`GET ${PREFIX}/selfaccessrequests`]: [
        200,
        { kind: 'AccessRequestList', items: [live('alice-x7k2p', 'Approved')] },
      ],
    };
    await run(requestCommand(), [
      'create',
      '--cluster',
      'edge',
      '--group',
      'g',
      '--reason',
      'x',
      '--wait',
      '-o',
      'json',
    ]);
    expect(got.map((g) => `${g.method} ${g.path}`)).toEqual([
      `POST ${PREFIX}/accessrequests`,
      `GET ${PREFIX}/selfaccessrequests`,
    ]);
    expect((JSON.parse(out) as AccessRequest).status?.phase).toBe('Approved');
    expect(err).toContain('sealion: access request alice-x7k2p created; waiting for its approval');
  });

  it('wait exits with the one line of a denial', async () => {
    answers = {
      [`GET ${PREFIX}/selfaccessrequests`]: [
        200,
        {
          items: [
            live('alice-x7k2p', 'Denied', {
              reviews: [{ user: 'bob', decision: 'Denied', reason: 'not now', time: '' }],
            }),
          ],
        },
      ],
    };
    await expect(run(requestCommand(), ['wait', 'alice-x7k2p'])).rejects.toThrow(
      'access request alice-x7k2p was denied by bob (not now)',
    );
    expect(out).toBe('');
  });

  it('list shows your own; --all everyone the RBAC lets you see, as YAML', async () => {
    answers = {
      [`GET ${PREFIX}/selfaccessrequests`]: [200, { items: [live('alice-1', 'Approved')] }],
      [`GET ${PREFIX}/accessrequests`]: [
        200,
        { items: [live('alice-1', 'Approved'), live('bob-1', 'Pending')] },
      ],
    };
    await run(requestCommand(), ['list']);
    expect(out.split('\n')[0]).toMatch(/^NAME +CLUSTERS +GROUPS +DURATION +PHASE +APPROVALS +ENDS +REASON$/);
    expect(out).toContain('alice-1');
    await run(requestCommand(), ['list', '--all', '-o', 'yaml']);
    expect(got.map((g) => g.path)).toEqual([`${PREFIX}/accessrequests`]);
    expect((parse(out) as { items: AccessRequest[] }).items.map((r) => r.metadata.name)).toEqual([
      'alice-1',
      'bob-1',
    ]);
  });

  it('approve and deny post a decision; a refusal says who may', async () => {
    answers = { [`POST ${PREFIX}/accessrequests/bob-1/approval`]: [201, live('bob-1', 'Approved')] };
    await run(requestCommand(), ['approve', 'bob-1', '--reason', 'on call']);
    expect(got[0]!.body).toEqual({
      apiVersion: `${GROUP}/v1alpha1`,
      kind: 'AccessRequestDecision',
      decision: 'Approved',
      reason: 'on call',
    });
    answers = {
      [`POST ${PREFIX}/accessrequests/alice-1/approval`]: [
        403,
        { kind: 'Status', message: 'you cannot approve your own request', code: 403 },
      ],
    };
    await expect(run(requestCommand(), ['deny', 'alice-1'])).rejects.toThrow(
      `cannot deny access request alice-1 on ${url}: HTTP 403: you cannot approve your own request; reviewers need the verb approve`,
    );
    expect(got[0]!.body).toMatchObject({ decision: 'Denied' });
    await expect(run(requestCommand(), ['withdraw', '../x'])).rejects.toThrow(
      '"../x" is not an access request name',
    );
    expect(got).toEqual([]);
  });

  it('withdraw posts to the withdrawal', async () => {
    answers = {
      [`POST ${PREFIX}/accessrequests/alice-1/withdrawal`]: [201, live('alice-1', 'Withdrawn')],
    };
    await run(requestCommand(), ['withdraw', 'alice-1']);
    expect(got[0]!.body).toMatchObject({ kind: 'AccessRequestDecision', decision: 'Withdrawn' });
    expect(out).toMatch(/alice-1 .* Withdrawn /);
  });

  it("whoami shows the hub's reason and the grants in force", async () => {
    answers = {
      ['POST /apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests']: [
        201,
        {
          kind: 'WhoAmIRequest',
          status: {
            kubernetesUserInfo: {
              user: {
                username: 'alice',
                groups: ['dev', 'oncall-admins'],
                extra: { 'sealion.dev/reason': ['INC-123'], 'sealion.dev/access-request': ['alice-1'] },
              },
            },
          },
        },
      ],
      [`GET ${PREFIX}/selfaccessrequests`]: [
        200,
        {
          items: [live('alice-1', 'Approved'), live('alice-0', 'Expired')],
        },
      ],
    };
    await run(whoamiCommand(), ['-o', 'json']);
    const info = JSON.parse(out) as { reason: string; grants: unknown[] };
    expect(info.reason).toBe('INC-123');
    expect(info.grants).toEqual([
      { name: 'alice-1', groups: ['oncall-admins'], clusters: ['edge'], expiresAt: expect.any(String) },
    ]);
    const table = await whoamiOutput(info as never, 'table', Date.now());
    expect(table).toMatch(/\nReason +INC-123\n/);
    expect(table).toMatch(/\nGrant: alice-1 +groups oncall-admins on edge, ends \S+ \(in 4\dm\)\n/);
    expect(table).not.toContain('Extra: sealion.dev/reason');
  });

  it('whoami goes on without grants where the hub serves none', async () => {
    answers = {
      ['POST /apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests']: [
        201,
        { status: { kubernetesUserInfo: { user: { username: 'alice', groups: [] } } } },
      ],
    };
    await run(whoamiCommand(), ['-o', 'json']);
    expect(JSON.parse(out)).not.toHaveProperty('grants');
    expect(err).toBe('');
  });

  it('clusters shows what each grant adds on each cluster', async () => {
    const review = (groups: string[], grants?: string[]) => ({
      status: {
        userInfo: {
          username: 'alice',
          groups,
          ...(grants ? { extra: { 'sealion.dev/access-request': grants } } : {}),
        },
      },
    });
    answers = {
      ['POST /clusters/edge/apis/authentication.k8s.io/v1/selfsubjectreviews']: [
        201,
        review(['dev', 'oncall-admins'], ['alice-1']),
      ],
      ['POST /apis/authentication.k8s.io/v1/selfsubjectreviews']: [201, review(['dev'])],
      [`GET ${PREFIX}/selfaccessrequests`]: [200, { items: [live('alice-1', 'Approved')] }],
    };
    await run(clustersCommand(), []);
    expect(out.split('\n')[0]).toMatch(/^CURRENT +CONTEXT +STATE +USER\/DETAIL +GRANTS +SERVER$/);
    expect(out).toMatch(/\n\* +edge +Ready +alice +alice-1 \(\+oncall-admins\) +https:/);
    expect(clustersTable([{ context: 'c', current: false, server: 's', state: 'Ready', detail: 'u' }])).toBe(
      'CURRENT   CONTEXT   STATE   USER/DETAIL   SERVER\n          c         Ready   u             s\n',
    );
  });

  it('completes request names from the hub: everyone the RBAC lets, and your own', async () => {
    answers = {
      [`GET ${PREFIX}/accessrequests`]: [403, { kind: 'Status', message: 'forbidden', code: 403 }],
      [`GET ${PREFIX}/selfaccessrequests`]: [200, { items: [live('alice-1', 'Pending')] }],
    };
    got = [];
    expect(await lookupNames('request', new Map([['kubeconfig', kubeconfig]]))).toEqual([
      { value: 'alice-1', description: 'Pending' },
    ]);
    expect(got.map((g) => g.path).sort()).toEqual([
      `${PREFIX}/accessrequests`,
      `${PREFIX}/selfaccessrequests`,
    ]);
  });
});
