// One unauthenticated client tries to exhaust the proxy: slow request headers, idle HTTP/2 sessions, and
// never-ending TokenCredentialRequest and write bodies on a thousand streams per connection, all at once. The
// concierge runs in a process of its own against a real API server, so its memory is measured alone: it must stay
// within LIVE_BUDGET_BYTES (and RSS_BUDGET_BYTES) of its resting size while a real user's requests keep being answered.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { connect as http2Connect, type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { request } from 'node:https';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';
import { loadCA, issueCert } from '../lib/pki/pki.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { startConciergeProcess, type ConciergeProcess } from './harness/concierge-process.ts';

/**
 * The most the attack below may add to what the proxy holds: its live memory (JavaScript heap in use plus memory
 * outside the heap, Buffers and native state included) after a full collection. It added under 1 MiB when this was
 * written; the 64 anonymous bodies the proxy accepts at once can pin about 4 MiB. Before the proxy bounded what
 * strangers may hold, the same attack pinned 191 MiB.
 */
const LIVE_BUDGET_BYTES = 32 * 1024 * 1024;
/**
 * The most it may add to the proxy's resident memory. Looser than the live budget: memory the collector frees is
 * not always given back to the system, and how much the heap grows between collections depends on how busy the
 * machine is (+1 MiB with the machine to itself, +72 MiB beside two other suites). On 8e623e9 the attack added 263 MiB.
 */
const RSS_BUDGET_BYTES = 160 * 1024 * 1024;
/** How long the attack runs. The deadlines it meets are tens of seconds; what matters here is what it can hold. */
const ATTACK_MS = 15_000;
const SLOW_HEADER_CONNECTIONS = 400;
const IDLE_SESSIONS = 400;
const BODY_SESSIONS = 4;
const STREAMS_PER_SESSION = 1000;
const BODY_CHUNK = Buffer.alloc(16 * 1024, 'x');
const TCR_PATH = '/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests';
const MiB = (bytes: number): string => `${(bytes / 1024 / 1024).toFixed(1)} MiB`;

describe('one unauthenticated client trying to exhaust the proxy', () => {
  let cluster: Cluster;
  let concierge: ConciergeProcess;
  let user: { certPem: string; keyPem: string };
  /** Everything the attack opened, destroyed when the test ends however it ends. */
  const sockets: TLSSocket[] = [];
  const sessions: ClientHttp2Session[] = [];
  const timers: NodeJS.Timeout[] = [];

  beforeAll(async () => {
    cluster = await startCluster({ name: 'exhaust', controllerManager: false });
    concierge = await startConciergeProcess(cluster);
    const signer = await loadCA(concierge.signer.certPem, concierge.signer.keyPem);
    user = await issueCert(signer, { commonName: 'pat', organizations: ['devs'], usage: 'client' });
  });

  afterAll(async () => {
    for (const t of timers) clearInterval(t);
    for (const s of sockets) s.destroy();
    for (const s of sessions) s.destroy();
    await concierge?.stop();
    await cluster?.stop();
  });

  /** A real user's request through the proxy (discovery, which every authenticated user may read). */
  const userRequest = (): Promise<number> =>
    new Promise((done, fail) => {
      const req = request(
        `${concierge.url}/api`,
        { ca: concierge.servingCA, cert: user.certPem, key: user.keyPem, agent: false },
        (res) => {
          res.resume();
          res.on('end', () => done(res.statusCode ?? 0));
        },
      );
      req.on('error', fail);
      req.end();
    });

  const h2 = (): ClientHttp2Session => {
    const session = http2Connect(concierge.url, { ca: concierge.servingCA });
    session.on('error', () => {});
    sessions.push(session);
    return session;
  };

  it('keeps its memory within budget and keeps answering a real user', async () => {
    for (let i = 0; i < 20; i++) expect(await userRequest()).toBe(200);
    const restingMemory = await concierge.memory();
    const resting = restingMemory.rss;
    const restingLive = restingMemory.heapUsed + restingMemory.external;
    const { port, hostname } = new URL(concierge.url);

    // Slow request headers: a byte at a time.
    for (let i = 0; i < SLOW_HEADER_CONNECTIONS; i++) {
      const socket = tlsConnect({
        host: hostname,
        port: Number(port),
        ca: concierge.servingCA,
        ALPNProtocols: ['http/1.1'],
      });
      socket.on('error', () => {});
      socket.once('secureConnect', () => socket.write(`POST ${TCR_PATH} HTTP/1.1\r\nHost: x\r\nX-Slow: `));
      sockets.push(socket);
    }
    timers.push(setInterval(() => sockets.forEach((s) => s.writable && s.write('a')), 1000));
    // HTTP/2 sessions that never open a stream.
    for (let i = 0; i < IDLE_SESSIONS; i++) h2();
    // Bodies that never end, on every stream a connection allows: anonymous logins and unauthenticated writes.
    const bodies: ClientHttp2Stream[] = [];
    for (let i = 0; i < BODY_SESSIONS; i++) {
      const session = h2();
      const path = i % 2 === 0 ? TCR_PATH : '/api/v1/namespaces/default/configmaps';
      for (let j = 0; j < STREAMS_PER_SESSION; j++) {
        const stream = session.request({
          ':method': 'POST',
          ':path': path,
          'content-type': 'application/json',
        });
        stream.on('error', () => {});
        stream.resume();
        bodies.push(stream);
      }
    }
    timers.push(
      setInterval(() => {
        for (const stream of bodies)
          if (stream.writable && stream.writableLength === 0) stream.write(BODY_CHUNK);
      }, 200),
    );

    // Sampled after a full collection: what the attack pins, not garbage a busy process has yet to collect.
    const live = (m: NodeJS.MemoryUsage): number => m.heapUsed + m.external;
    let peak = resting;
    let peakLive = restingLive;
    const answered: number[] = [];
    const started = Date.now();
    while (Date.now() - started < ATTACK_MS) {
      await new Promise((done) => setTimeout(done, 500));
      const now = await concierge.memory();
      peak = Math.max(peak, now.rss);
      peakLive = Math.max(peakLive, live(now));
      answered.push(await userRequest());
    }
    const grown = peak - resting;
    const grownLive = peakLive - restingLive;
    process.stderr.write(
      `[exhaustion] live memory ${MiB(restingLive)} at rest, +${MiB(grownLive)} under attack (budget +${MiB(LIVE_BUDGET_BYTES)}); ` +
        `resident ${MiB(resting)}, +${MiB(grown)} (budget +${MiB(RSS_BUDGET_BYTES)})\n`,
    );
    expect(concierge.alive()).toBe(true);
    expect(answered.every((code) => code === 200)).toBe(true);
    expect(grownLive).toBeLessThan(LIVE_BUDGET_BYTES);
    expect(grown).toBeLessThan(RSS_BUDGET_BYTES);
  }, 120_000);
});
