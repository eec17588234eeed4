// The OIDC login's local server against the real test issuer (oidc-provider) and a scripted browser: what the
// browser is given to open, and what the callback takes.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fetch } from 'undici';
import { browse } from '../dev/browser.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';
import type { OIDCLoginFlags } from './exec-credential.ts';
import { oidcLogin } from './login-oidc.ts';
import { fromAnotherUser, loopbackPeerUid } from './loopback-peer.ts';

let issuer: TestIssuer;
let dir: string;

const flags = (over: Partial<OIDCLoginFlags> = {}): OIDCLoginFlags => ({
  issuer: issuer.url,
  clientId: issuer.clientId,
  scopes: 'openid',
  caBundleData: issuer.caData,
  listenPort: '0',
  skipBrowser: true,
  exchange: false,
  authenticatorType: 'jwt',
  authenticatorName: '',
  groupSuffix: 'sealion.dev',
  conciergeEndpoint: '',
  conciergeCaBundleData: '',
  ...over,
});

/** Starts a login in a fresh cache; resolves `link` with the URL it prints for the browser. */
function startLogin(
  over: Partial<OIDCLoginFlags> = {},
  env: NodeJS.ProcessEnv = {},
): { login: Promise<unknown>; link: Promise<string> } {
  const home = mkdtempSync(join(dir, 'home-'));
  let printed: (url: string) => void = () => {};
  const link = new Promise<string>((done) => (printed = done));
  const login = oidcLogin(flags(over), { ...env, XDG_CONFIG_HOME: home }, (line) => {
    const url = / in a browser:\n {2}(\S+)$/.exec(line)?.[1];
    if (url) printed(url);
  });
  // Settled by each test; this keeps an early rejection from counting as unhandled.
  login.catch(() => {});
  return { login, link };
}

beforeAll(async () => {
  issuer = await startOIDCIssuer({ login: { username: 'ada@example.com', groups: ['readers'] } });
  dir = mkdtempSync(join(tmpdir(), 'sealion-oidc-browser-'));
});
afterAll(async () => {
  await issuer.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('sealion login oidc: what the browser opens', () => {
  it('opens a local link without the state or PKCE challenge; the authorization URL is only its redirect', async () => {
    // A stand-in for xdg-open that writes down its arguments: what every local user could read in the process list.
    const bin = mkdtempSync(join(dir, 'bin-'));
    const seen = join(bin, 'argv');
    writeFileSync(join(bin, 'xdg-open'), `#!/bin/sh\nprintf '%s\\n' "$@" > '${seen}'\n`);
    chmodSync(join(bin, 'xdg-open'), 0o755);
    const { login, link } = startLogin({ skipBrowser: false }, { PATH: `${bin}:${process.env['PATH']}` });
    const url = await link;
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/login\/[\w-]{20,}$/);
    // The stand-in runs on its own: its file is written when it has.
    await eventually(() => expect(readFileSafe(seen)).toBe(`${url}\n`), 20_000, 50);
    expect(await browse(url, { caPem: issuer.caPem })).toMatchObject({ status: 200 });
    expect(await login).toMatchObject({ status: { token: expect.any(String) } });
  }, 30_000);

  it('answers stray callbacks (no state, a wrong one, before the link was followed) with 400 and keeps waiting', async () => {
    const { login, link } = startLogin();
    const url = await link;
    const base = new URL(url).origin;
    for (const stray of ['/callback', '/callback?code=x&state=wrong', '/callback?error=access_denied']) {
      const answer = await fetch(`${base}${stray}`);
      expect({ stray, status: answer.status }).toEqual({ stray, status: 400 });
    }
    expect(await browse(url, { caPem: issuer.caPem })).toMatchObject({ status: 200 });
    expect(await login).toMatchObject({ status: { token: expect.any(String) } });
  });

  it('hands the authorization URL out once; a second fetch of the link stops the login', async () => {
    const { login, link } = startLogin();
    const url = await link;
    const first = await fetch(url, { redirect: 'manual' });
    expect(first.status).toBe(302);
    // The state and challenge are in the redirect, which only the first to follow the link gets.
    const location = new URL(first.headers.get('location')!);
    expect(location.searchParams.get('state')).toBeTruthy();
    expect(location.searchParams.get('code_challenge')).toBeTruthy();
    expect(first.headers.get('cache-control')).toBe('no-store');
    const second = await fetch(url, { redirect: 'manual' });
    expect(second.status).toBe(410);
    await expect(login).rejects.toThrow(/the login link was opened twice/);
  });
});

describe('loopback peers', () => {
  const TABLE = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 2 1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 3 1
   3: 0100007F:D432 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4 1
`;

  it('reads the owner of the socket that connected, not of the one that accepted', () => {
    expect(loopbackPeerUid(0xd431, 0x1f90, [TABLE])).toBe(1001);
    expect(loopbackPeerUid(0xd432, 0x1f90, [TABLE])).toBe(0);
    expect(loopbackPeerUid(0xd433, 0x1f90, [TABLE])).toBeUndefined();
    expect(loopbackPeerUid(0xd431, 0x1f90, [''])).toBeUndefined();
  });

  it("refuses another user's connection, never root's or an unknown one", () => {
    const me = process.getuid!();
    const table = TABLE.replaceAll(' 1000 ', ` ${String(me).padStart(4)} `);
    expect(fromAnotherUser(0xd431, 0x1f90, [table])).toBe(me !== 1001);
    expect(fromAnotherUser(0xd432, 0x1f90, [table])).toBe(false);
    expect(fromAnotherUser(0xd433, 0x1f90, [table])).toBe(false);
  });

  it("finds this process's own connection in the kernel's table (Linux)", async () => {
    if (process.platform !== 'linux') return;
    const server: Server = createServer();
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    const accepted = new Promise<number>((done) =>
      server.once('connection', (socket) => done(socket.remotePort!)),
    );
    const { connect } = await import('node:net');
    const port = (server.address() as { port: number }).port;
    const client = connect(port, '127.0.0.1');
    const peerPort = await accepted;
    expect(loopbackPeerUid(peerPort, port)).toBe(process.getuid!());
    expect(fromAnotherUser(peerPort, port)).toBe(false);
    client.destroy();
    await new Promise((done) => server.close(done));
  });
});

function readFileSafe(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}
