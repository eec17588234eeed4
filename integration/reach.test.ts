// `sealion port-forward` to Services and pods on real nodes, on the hub (the concierge dials) and on a cluster reached
// only through its agent (the agent dials): bytes both ways, a 1 GiB stream, half-close, 100 connections at once,
// and what the cluster refuses (a user without services/proxy, an ExternalName, a Service whose endpoint is the API
// server, a pod on its node's network, a name that is not there), each a Status the user reads. On both, each user's
// answer for each port is the one the cluster's API server gives its own proxy for a certificate its CA signs.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AuditEvent } from '../concierge/audit/types.ts';
import { REPO_ROOT } from '../dev/build.ts';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_USER,
  EDGE,
  startInstalledSealion,
  stopInstalled,
  type InstalledSealion,
  type Running,
} from '../dev/installed.ts';
import { eventually } from '../dev/eventually.ts';
import { deployReachWorkload } from '../dev/reach-workload.ts';
import { runKubectl } from '../dev/cluster.ts';
import { dieWithParent, runSealion, stopChild, waitForOutput } from '../dev/processes.ts';

/** The users' tokens live this long: longer than any run of this file. */
const TOKEN_SECONDS = 6 * 60 * 60;

const running: Running = {};
let dir: string;
let installed: InstalledSealion;
const children: ChildProcess[] = [];

/** Starts `sealion port-forward` with `args` and returns its local port once it listens, and its output so far. */
async function forward(
  kubeconfig: string,
  args: string[],
): Promise<{ port: number; child: ChildProcess; stderr: () => string }> {
  const [command, argv] = dieWithParent(process.execPath, [
    join(REPO_ROOT, 'bin/sealion.js'),
    'port-forward',
    `--kubeconfig=${kubeconfig}`,
    '-n',
    DEMO_NAMESPACE,
    ...args,
  ]);
  const child = spawn(command, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let stderr = '';
  child.stderr.on('data', (c: Buffer | string) => (stderr += String(c)));
  const { output } = await waitForOutput(child, /Forwarding from 127\.0\.0\.1:(\d+)/);
  return { port: Number(/127\.0\.0\.1:(\d+)/.exec(output)![1]), child, stderr: () => stderr };
}

/** Sends `data` on a new connection to `port`, ends it, and resolves with all that came back before the end. */
function exchange(port: number, data: Buffer | string): Promise<Buffer> {
  return new Promise((done, fail) => {
    const socket: Socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.once('end', () => {
      socket.end();
      done(Buffer.concat(chunks));
    });
    socket.once('error', fail);
    socket.end(data);
  });
}

/** Streams `total` bytes in 1 MiB pieces, then ends; resolves with what came back. */
function stream(port: number, total: number): Promise<string> {
  return new Promise((done, fail) => {
    const socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    const piece = randomBytes(1 << 20);
    let sent = 0;
    const pump = (): void => {
      while (sent < total) {
        sent += piece.length;
        if (!socket.write(piece)) return void socket.once('drain', pump);
      }
      socket.end();
    };
    let answer = '';
    socket.on('data', (c: Buffer) => (answer += c.toString('utf8')));
    socket.once('end', () => {
      socket.end();
      done(answer);
    });
    socket.once('error', fail);
    socket.once('connect', pump);
  });
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-reach-'));
  installed = await startInstalledSealion(running, () => {});
  await Promise.all([
    deployReachWorkload(installed.hub, installed.image.name, 'hub'),
    deployReachWorkload(installed.edge, installed.image.name, EDGE),
  ]);
  // The exec plugin trades each token for 5-minute certificates, and again whenever one expires: the tokens must
  // outlive the whole file, which on a busy machine (two 1 GiB streams) takes far longer than their default 5 minutes.
  const lifetime = { expiresIn: TOKEN_SECONDS };
  const token = await installed.issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] }, lifetime);
  const viewer = await installed.issuer.mint(
    { username: 'viewer@sealion.dev', groups: ['demo-viewers'] },
    lifetime,
  );
  writeFileSync(join(dir, 'hub.kubeconfig'), await installed.kubeconfig(token));
  writeFileSync(join(dir, 'edge.kubeconfig'), await installed.kubeconfig(token, EDGE));
  writeFileSync(join(dir, 'viewer-hub.kubeconfig'), await installed.kubeconfig(viewer));
  writeFileSync(join(dir, 'viewer-edge.kubeconfig'), await installed.kubeconfig(viewer, EDGE));
}, 420_000);

afterAll(async () => {
  await Promise.all(children.map((c) => stopChild(c)));
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

describe.each([
  ['the hub, where the concierge dials', 'hub', ''],
  [`${EDGE}, where its agent dials`, EDGE, 'edge'],
])('sealion port-forward on %s', (_title, where, file) => {
  const kubeconfig = (who = ''): string => join(dir, `${who}${file || 'hub'}.kubeconfig`);

  it('reaches a Service: bytes both ways, a named port, an HTTP server, a pod by name', async () => {
    const echo = await forward(kubeconfig(), ['svc/reach-echo', ':echo', ':80']);
    const mib = randomBytes(1 << 20);
    // What was sent comes back whole, and the server's end follows the client's: a half-close both ways.
    const back = await exchange(echo.port, mib);
    expect({ length: back.length, stderr: echo.stderr() }).toEqual({ length: mib.length, stderr: '' });
    expect(back.equals(mib)).toBe(true);
    await stopChild(echo.child);

    const http = await forward(kubeconfig(), ['service/reach-echo', ':http']);
    const answer = (await exchange(http.port, 'GET / HTTP/1.0\r\n\r\n')).toString('utf8');
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    expect(answer).toContain(`hello from ${where}\n`);
    await stopChild(http.child);

    const pod = await forward(kubeconfig(), ['pod/reach-echo', ':9000']);
    expect((await exchange(pod.port, 'to the pod')).toString('utf8')).toBe('to the pod');
    await stopChild(pod.child);
  });

  it('audits each connection where it landed: who, what, its bytes both ways and when it ended', async () => {
    const echo = await forward(kubeconfig(), ['svc/reach-echo', ':echo']);
    // A length of its own, so the event found is this connection's.
    const marker = randomBytes(where === 'hub' ? 3000 : 3001);
    expect((await exchange(echo.port, marker)).equals(marker)).toBe(true);
    await stopChild(echo.child);
    const bytes = `${marker.length} sent, ${marker.length} received`;
    const event = await eventually(async () => {
      const logs = await installed.hub.kubectl([
        'logs',
        '-n',
        'sealion-concierge',
        '-l',
        'app=sealion-concierge',
        '--tail=-1',
        '--max-log-requests=10',
      ]);
      const found = logs.stdout
        .split('\n')
        .filter((line) => line.startsWith('{"kind":"Event"'))
        .map((line) => JSON.parse(line) as AuditEvent)
        .find((e) => e.annotations?.['sealion.dev/bytes'] === bytes);
      expect(found).toBeDefined();
      return found!;
    });
    expect(event).toMatchObject({
      stage: 'ResponseComplete',
      verb: 'create',
      user: { username: DEMO_USER },
      objectRef: {
        resource: 'services',
        subresource: 'proxy',
        namespace: DEMO_NAMESPACE,
        name: 'reach-echo:echo',
      },
      responseStatus: { code: 101 },
      annotations: {
        'sealion.dev/route': where === 'hub' ? 'local' : expect.stringMatching(/^(tunnel|peer)$/),
      },
    });
  });

  it('carries a 1 GiB stream, and the answer that follows the client ending its side', async () => {
    const counter = await forward(kubeconfig(), ['svc/reach-echo', ':count']);
    expect(await stream(counter.port, 1 << 30)).toBe(String(1 << 30));
    await stopChild(counter.child);
  }, 300_000);

  it('serves 100 connections at once', async () => {
    const echo = await forward(kubeconfig(), ['svc/reach-echo', ':echo']);
    const payloads = Array.from({ length: 100 }, (_, i) =>
      Buffer.from(`${i}:${randomBytes(8 * 1024).toString('hex')}`),
    );
    const answers = await Promise.all(payloads.map((p) => exchange(echo.port, p)));
    expect(answers.filter((a, i) => a.equals(payloads[i]!)).length).toBe(100);
    expect(echo.stderr()).not.toContain('error');
    await stopChild(echo.child);
  });

  // What the cluster says before anything listens: one line, exit 1, as kubectl port-forward checks the pod first. The
  // edge kubeconfig's server is the proxy's /clusters/edge, which the messages name. The demo user may read Services
  // on the hub but not on edge, where their names and ports are left to the cluster: it refuses each connection with
  // a Status instead (a user may reach what they may not read).
  const on = file ? ` on cluster ${EDGE}` : '';
  const readsServices = !file;
  it.each([
    [
      'a user without services/proxy',
      'viewer-',
      ['svc/reach-echo', ':echo'],
      true,
      `forbidden: you may not create services/proxy "reach-echo:echo" in namespace ${DEMO_NAMESPACE}${on}`,
      /forbidden/,
    ],
    [
      'an ExternalName Service',
      '',
      ['svc/outside', ':443'],
      readsServices,
      `service ${DEMO_NAMESPACE}/outside${on} is an ExternalName`,
      /ExternalName/,
    ],
    [
      "a pod on its node's network",
      '',
      ['pod/on-node', ':10250'],
      true,
      `pod ${DEMO_NAMESPACE}/on-node${on} uses its node's network`,
      /node's network/,
    ],
    [
      'a Service that is not there',
      '',
      ['svc/nowhere', ':80'],
      readsServices,
      `no service nowhere in namespace ${DEMO_NAMESPACE}${on}`,
      /services "nowhere" not found/,
    ],
    [
      'a port the Service does not have',
      '',
      ['svc/reach-echo', ':8443'],
      readsServices,
      `service ${DEMO_NAMESPACE}/reach-echo${on} has no TCP port 8443; its ports: `,
      /has no TCP port 8443/,
    ],
    [
      "a Service whose only endpoint is the API server's address",
      '',
      ['svc/bare', ':443'],
      false,
      '',
      /no ready pod/,
    ],
  ] as const)('refuses %s, in one line', async (_what, who, args, beforeListening, line, status) => {
    if (beforeListening) {
      const run = await runSealion([
        'port-forward',
        `--kubeconfig=${kubeconfig(who)}`,
        '-n',
        DEMO_NAMESPACE,
        ...args,
      ]);
      expect(run).toMatchObject({ code: 1, stdout: '' });
      expect(run.stderr.split('\n').filter(Boolean)).toEqual([expect.stringContaining(`sealion: ${line}`)]);
      return;
    }
    const refused = await forward(kubeconfig(who), [...args]);
    // The connection is closed without a byte of the target's, and the forward says why.
    expect((await exchange(refused.port, 'anything')).length).toBe(0);
    await eventually(async () => expect(refused.stderr()).toMatch(status));
    await stopChild(refused.child);
  });
});

describe('the API server as the oracle', () => {
  /** A third user may reach one port of the Service, and no other: by name on the hub, by number on edge. */
  const onePort = 'one-port@sealion.dev';
  const ONE_PORT: Record<string, string> = { hub: 'http', [EDGE]: '80' };
  const USERS: [string, string[]][] = [
    [DEMO_USER, [DEMO_GROUP]],
    [onePort, []],
    ['viewer@sealion.dev', ['demo-viewers']],
  ];

  /**
   * Whether the API server's own proxy lets this kubeconfig's user reach `port` of the Service (a POST through it is
   * create services/proxy on `reach-echo:<port>`); a refusal must be the API server's 403.
   */
  async function apiServerReaches(kubeconfig: string, port: string, where: string): Promise<boolean> {
    const straight = await runKubectl(
      installed.hub.binaries.kubectl,
      kubeconfig,
      [
        'create',
        '--raw',
        `/api/v1/namespaces/${DEMO_NAMESPACE}/services/reach-echo:${port}/proxy/`,
        '-f',
        '-',
      ],
      { input: '' },
    );
    if (straight.code !== 0) expect(straight.stderr).toMatch(/forbidden|Forbidden/);
    return straight.code === 0 && straight.stdout.includes(`hello from ${where}\n`);
  }

  /** Whether `sealion port-forward` with this kubeconfig reaches `port`; a refusal must be a forbidden Status. */
  async function sealionReaches(kubeconfig: string, port: string, where: string): Promise<boolean> {
    // A user the cluster refuses is told before anything listens: the command exits with the refusal.
    const through = await forward(kubeconfig, ['svc/reach-echo', `:${port}`]).catch((err: Error) => {
      expect(err.message).toMatch(/sealion: forbidden: you may not create services\/proxy "reach-echo:/);
      return undefined;
    });
    if (!through) return false;
    const answer = (await exchange(through.port, 'GET / HTTP/1.0\r\n\r\n')).toString('utf8');
    const reached = answer.includes(`hello from ${where}\n`);
    if (!reached) await eventually(async () => expect(through.stderr()).toMatch(/forbidden/));
    await stopChild(through.child);
    return reached;
  }

  /** Writes a kubeconfig into the test's folder; resolves with its path. */
  async function save(name: string, kubeconfig: Promise<string>): Promise<string> {
    const file = join(dir, `${name}.kubeconfig`);
    writeFileSync(file, await kubeconfig);
    return file;
  }

  // The oracle's user is no Sealion user: a client certificate the cluster's own CA signs for the same name and
  // groups, sent straight to that cluster's API server. A Sealion that mapped the identity wrong (a group lost, a name
  // changed) would then answer otherwise, where the oracle of its own direct login would carry the same mistake. The
  // grant differs between the clusters, so an answer the hub gave for edge shows too.
  it.each([
    ['the hub, where the concierge dials', 'hub'],
    [`${EDGE}, where its agent dials`, EDGE],
  ])(
    "on %s, allows and refuses each port of a Service as the API server's own proxy does for a certificate of its CA",
    async (_title, where) => {
      const cluster = where === 'hub' ? installed.hub : installed.edge;
      const grant = await cluster.kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({
          apiVersion: 'v1',
          kind: 'List',
          items: [
            {
              apiVersion: 'rbac.authorization.k8s.io/v1',
              kind: 'Role',
              metadata: { name: 'reach-one-port', namespace: DEMO_NAMESPACE },
              rules: [
                {
                  apiGroups: [''],
                  resources: ['services/proxy'],
                  verbs: ['create'],
                  resourceNames: [`reach-echo:${ONE_PORT[where]!}`],
                },
              ],
            },
            {
              apiVersion: 'rbac.authorization.k8s.io/v1',
              kind: 'RoleBinding',
              metadata: { name: 'one-port', namespace: DEMO_NAMESPACE },
              roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'reach-one-port' },
              subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: onePort }],
            },
          ],
        }),
      });
      expect(grant.stderr).toBe('');
      const rows: string[] = [];
      const mismatches: string[] = [];
      for (const [user, groups] of USERS) {
        const oracle = await cluster.userKubeconfig(user, groups);
        const token = await installed.issuer.mint({ username: user, groups }, { expiresIn: TOKEN_SECONDS });
        // Sealion's ways in: its proxy (on edge, through the agent's tunnel) and, on the hub, its direct login, whose
        // certificate the hub's API server trusts.
        const ways: [string, string][] = [
          [
            'port-forward',
            await save(`${user}-${where}-proxy`, installed.kubeconfig(token, where === 'hub' ? '' : EDGE)),
          ],
        ];
        if (where === 'hub')
          ways.push([
            'direct login',
            await save(`${user}-direct`, installed.kubeconfig(token, '', false, 'direct')),
          ]);
        // Both ports at once: each answer is decided on its own.
        const answers = await Promise.all(
          ['http', '80'].map(async (port) => {
            const [apiserver, ...sealion] = await Promise.all([
              apiServerReaches(oracle, port, where),
              ...ways.map(([way, kubeconfig]) =>
                way === 'port-forward'
                  ? sealionReaches(kubeconfig, port, where)
                  : apiServerReaches(kubeconfig, port, where),
              ),
            ]);
            return { port, apiserver, sealion };
          }),
        );
        for (const { port, apiserver, sealion } of answers) {
          rows.push(`${user} ${port} ${apiserver}`);
          sealion.forEach((reached, i) => {
            if (reached !== apiserver)
              mismatches.push(`${user} ${port}: the API server ${apiserver}, ${ways[i]![0]} ${reached}`);
          });
        }
      }
      expect(mismatches).toEqual([]);
      // Each kind of answer is there: both ports, the one port this cluster grants, none.
      expect(rows).toEqual([
        `${DEMO_USER} http true`,
        `${DEMO_USER} 80 true`,
        `${onePort} http ${ONE_PORT[where] === 'http'}`,
        `${onePort} 80 ${ONE_PORT[where] === '80'}`,
        'viewer@sealion.dev http false',
        'viewer@sealion.dev 80 false',
      ]);
    },
    180_000,
  );
});
