// No request with a body is lost, through the tunnel (both transports, each with the real `sealion agent` process)
// or on the hub's own path: each case runs many times, over HTTP/1.1 and HTTP/2 as kubectl speaks it, and every
// request must get the API server's own answer. The API server answers some of them before it has read the body
// and then closes (a refused or oversized write): that is the case that once reached users as ECONNRESET.
// One cluster is both hub and managed cluster, so the tunnel is the only difference between the paths.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { ChildProcess } from 'node:child_process';
import { connect as http2Connect, type ClientHttp2Session } from 'node:http2';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { createBootstrapToken } from '../lib/kube/bootstrap.ts';
import { UNCOUNTED_SESSION_MEMORY_MB } from '../lib/http2/pool.ts';
import { newKubeClients } from '../lib/kube/kube.ts';
import { prepareAgentCluster, startAgentProcess } from '../dev/agent.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { applyJWTAuthenticator, startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const GROUP = 'body-writers';
/** Where the cases create ConfigMaps (the user may create those, and nothing else). */
const ALLOWED = 'bodies';
/** Small cases run this many times per path and protocol; the large ones a tenth as often. */
const REPEAT = Number(process.env['BODIES_REPEAT'] ?? 200);
const IN_FLIGHT = 8;

let cluster: Cluster;
let issuer: TestIssuer;
let concierge: LocalConcierge;
let token = '';
const agents: ChildProcess[] = [];

/** The paths a request can take to the same API server. */
const PATHS = {
  hub: '',
  'tunnel, direct': '/clusters/bodies-direct',
  'tunnel, websocket': '/clusters/bodies-ws',
};

const configMap = (name: string, bytes = 16): string =>
  JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name }, data: { k: 'x'.repeat(bytes) } });

interface Case {
  name: string;
  path: string;
  body: () => Buffer;
  /** The status the API server (or, for a bad token, the proxy) answers. */
  status: number;
  token?: string;
  /** Sent without a length, in pieces. */
  chunked?: boolean;
  repeat: number;
}

const MiB = 1024 * 1024;
const ALL_CASES: Case[] = [
  {
    name: 'allowed',
    path: `/api/v1/namespaces/${ALLOWED}/configmaps?dryRun=All`,
    body: () => Buffer.from(configMap('allowed')),
    status: 201,
    repeat: REPEAT,
  },
  {
    name: 'refused by RBAC',
    path: `/api/v1/namespaces/${ALLOWED}/secrets`,
    body: () => Buffer.from(configMap('refused').replace('ConfigMap', 'Secret')),
    status: 403,
    repeat: REPEAT,
  },
  {
    name: 'bad token',
    path: `/api/v1/namespaces/${ALLOWED}/configmaps?dryRun=All`,
    body: () => Buffer.from(configMap('bad-token')),
    status: 401,
    token: 'not-a-token',
    repeat: REPEAT,
  },
  {
    name: 'no such namespace',
    path: '/api/v1/namespaces/nowhere/configmaps?dryRun=All',
    body: () => Buffer.from(configMap('nowhere')),
    status: 404,
    repeat: REPEAT,
  },
  {
    name: 'already exists',
    path: `/api/v1/namespaces/${ALLOWED}/configmaps?dryRun=All`,
    body: () => Buffer.from(configMap('exists')),
    status: 409,
    repeat: REPEAT,
  },
  {
    name: 'invalid',
    path: `/api/v1/namespaces/${ALLOWED}/configmaps?dryRun=All`,
    body: () => Buffer.from(configMap('Not_A_Name')),
    status: 422,
    repeat: REPEAT,
  },
  {
    name: 'chunked',
    path: `/api/v1/namespaces/${ALLOWED}/configmaps?dryRun=All`,
    body: () => Buffer.from(configMap('chunked', 64 * 1024)),
    status: 201,
    chunked: true,
    repeat: REPEAT,
  },
  {
    name: '900 KiB',
    path: `/api/v1/namespaces/${ALLOWED}/configmaps?dryRun=All`,
    body: () => Buffer.from(configMap('large', 900 * 1024)),
    status: 201,
    repeat: Math.ceil(REPEAT / 10),
  },
  {
    // Over the API server's limit on a request body (3 MiB): it answers 413 without reading it all, then resets the
    // stream with NO_ERROR. Every hop relays the answer and stops sending the rest.
    name: '10 MiB',
    path: `/api/v1/namespaces/${ALLOWED}/configmaps?dryRun=All`,
    body: () => Buffer.from(configMap('huge', 10 * MiB)),
    status: 413,
    repeat: Math.ceil(REPEAT / 10),
  },
];

/** BODIES_CASES, a regular expression, picks cases by name (to look at one). */
const CASES = ALL_CASES.filter((c) => new RegExp(process.env['BODIES_CASES'] ?? '').test(c.name));

type Outcome = { status: number } | { error: string };

/** Over HTTP/1.1, with a keep-alive pool as client-go's HTTP/1 transport has. */
function sendHttp1(agent: HttpsAgent, prefix: string, c: Case): Promise<Outcome> {
  return new Promise((done) => {
    const body = c.body();
    const req = httpsRequest(
      {
        host: '127.0.0.1',
        port: new URL(concierge.url).port,
        method: 'POST',
        path: `${prefix}${c.path}`,
        agent,
        headers: {
          authorization: `Bearer ${c.token ?? token}`,
          'content-type': 'application/json',
          ...(c.chunked ? {} : { 'content-length': body.length }),
        },
      },
      (res) => {
        res.resume();
        res.once('end', () => done({ status: res.statusCode ?? 0 }));
        res.once('error', (err) => done({ error: err.message }));
      },
    );
    req.once('error', (err) => done({ error: err.message }));
    writeBody(req, body, c.chunked);
  });
}

/** Over HTTP/2, as kubectl sends. */
function sendHttp2(session: ClientHttp2Session, prefix: string, c: Case): Promise<Outcome> {
  return new Promise((done) => {
    const body = c.body();
    const stream = session.request({
      ':method': 'POST',
      ':path': `${prefix}${c.path}`,
      authorization: `Bearer ${c.token ?? token}`,
      'content-type': 'application/json',
      ...(c.chunked ? {} : { 'content-length': body.length }),
    });
    let status = 0;
    stream.once('response', (headers) => (status = Number(headers[':status'])));
    stream.on('data', () => {});
    stream.once('end', () => done({ status }));
    stream.once('error', (err: Error) => done({ error: err.message }));
    writeBody(stream, body, c.chunked);
  });
}

/** Writes the body whole, or in pieces when chunked; a write after the answer came is not an error of the case. */
function writeBody(
  to: NodeJS.WritableStream & { destroyed?: boolean },
  body: Buffer,
  chunked?: boolean,
): void {
  if (!chunked) return void to.end(body);
  const piece = 8 * 1024;
  let at = 0;
  const next = (): void => {
    if (to.destroyed) return;
    if (at >= body.length) return void to.end();
    to.write(body.subarray(at, (at += piece)), () => setImmediate(next));
  };
  next();
}

/** Runs `send` `times` times, IN_FLIGHT at once; counts the statuses and errors. */
async function run(times: number, send: () => Promise<Outcome>): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  let left = times;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (left-- > 0) {
        const outcome = await send();
        const key = 'status' in outcome ? String(outcome.status) : `error: ${outcome.error}`;
        counts[key] = (counts[key] ?? 0) + 1;
      }
    }),
  );
  return counts;
}

beforeAll(async () => {
  cluster = await startCluster({ name: 'bodies', controllerManager: false });
  await cluster.kubectl(['create', 'namespace', NS]);
  concierge = await startLocalConcierge(cluster, { tunnel: { port: 0, namespace: NS } });
  const tunnelPort = concierge.concierge.tunnel!.port;
  issuer = await startOIDCIssuer({ audience: 'sealion-bodies' });
  await applyJWTAuthenticator(cluster, 'bodies', issuer, 'sealion-bodies');
  token = await issuer.mint({ username: 'writer@example.com', groups: [GROUP] }, { expiresIn: 3600 });
  for (const args of [
    ['create', 'namespace', ALLOWED],
    // Anywhere, so that a namespace that does not exist gets its 404 rather than a 403.
    ['create', 'clusterrole', 'writer', '--verb=create', '--resource=configmaps'],
    ['create', 'clusterrolebinding', 'writer', '--clusterrole=writer', `--group=${GROUP}`],
    ['create', 'configmap', 'exists', '-n', ALLOWED],
  ]) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  for (const name of ['bodies-direct', 'bodies-ws'])
    await cluster.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
        kind: 'Cluster',
        metadata: { name },
        spec: {},
      }),
    });
  const hub = `https://127.0.0.1:${tunnelPort}`;
  const kubeconfig = await prepareAgentCluster(cluster, AGENT_NS);
  const clients = newKubeClients({ path: cluster.kubeconfigPath });
  for (const [name, transport] of [
    ['bodies-direct', 'direct'],
    ['bodies-ws', 'websocket'],
  ] as const)
    await startAgentProcess({
      cluster: name,
      hub,
      tunnelCAPem: concierge.concierge.tunnel!.caPem,
      kubeconfig,
      namespace: AGENT_NS,
      bootstrapToken: (await createBootstrapToken(clients, NS, name)).token,
      transport,
      started: (child) => agents.push(child),
    });
}, 180_000);

afterAll(async () => {
  for (const agent of agents) agent.kill('SIGKILL');
  await concierge?.stop();
  await issuer?.stop();
  await cluster?.stop();
});

describe.each(Object.entries(PATHS))('requests with a body, %s', (_path, prefix) => {
  it.each(['HTTP/1.1', 'HTTP/2'])(
    'get the API server’s answer every time over %s',
    async (protocol) => {
      const agent = new HttpsAgent({
        keepAlive: true,
        maxSockets: IN_FLIGHT,
        ca: concierge.servingCA.certPem,
      });
      // Node's client refuses to hold more than maxSessionMemory of unsent data (10 MB by default), which eight
      // 10 MiB bodies at once are, and counts a body the API server refused early against it for good (see
      // lib/http2/pool.ts); Go's client, kubectl's, has no such limit.
      const session = http2Connect(concierge.url, {
        ca: concierge.servingCA.certPem,
        maxSessionMemory: UNCOUNTED_SESSION_MEMORY_MB,
      });
      session.on('error', () => {});
      try {
        // The path is up before the count starts (an agent may just have connected).
        await eventually(async () =>
          expect(await sendHttp1(agent, prefix, ALL_CASES[0]!)).toEqual({ status: ALL_CASES[0]!.status }),
        );
        const results: Record<string, Record<string, number>> = {};
        for (const c of CASES)
          results[c.name] = await run(c.repeat, () =>
            protocol === 'HTTP/2' ? sendHttp2(session, prefix, c) : sendHttp1(agent, prefix, c),
          );
        // One table, so that a red run says which case got what.
        expect(results).toEqual(Object.fromEntries(CASES.map((c) => [c.name, { [c.status]: c.repeat }])));
      } finally {
        agent.destroy();
        session.destroy();
      }
    },
    300_000,
  );

  it('keeps serving after clients cut their bodies off halfway', async () => {
    const session = http2Connect(concierge.url, { ca: concierge.servingCA.certPem });
    session.on('error', () => {});
    try {
      const body = Buffer.from(configMap('cut', 256 * 1024));
      await Promise.all(
        Array.from(
          { length: REPEAT / 4 },
          () =>
            new Promise<void>((done) => {
              const stream = session.request({
                ':method': 'POST',
                ':path': `${prefix}${ALL_CASES[0]!.path}`,
                authorization: `Bearer ${token}`,
                'content-type': 'application/json',
                'content-length': body.length,
              });
              stream.on('error', () => {});
              stream.on('close', () => done());
              stream.write(body.subarray(0, body.length / 2), () => stream.close());
            }),
        ),
      );
      const agent = new HttpsAgent({ keepAlive: true, ca: concierge.servingCA.certPem });
      try {
        expect(await run(REPEAT / 4, () => sendHttp1(agent, prefix, ALL_CASES[0]!))).toEqual({
          '201': REPEAT / 4,
        });
      } finally {
        agent.destroy();
      }
    } finally {
      session.destroy();
    }
  });
});
