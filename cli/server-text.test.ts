// Every path that prints a server's text escapes it (printable.ts): a concierge's Status message, a TokenCredentialRequest
// failure, an issuer's error, an authenticator's status, and the identity whoami shows.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import type { KubeClients } from '../lib/kube/kube.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { findFrontend, type GetKubeconfigFlags } from './get-kubeconfig.ts';
import { explain } from './login-oidc.ts';
import { exchange } from './exec-credential.ts';
import { whoamiOutput, type Whoami } from './whoami.ts';

/** Escape sequences, a carriage return, BEL, the 8-bit CSI, a bidi override and a zero-width space at once. */
const HOSTILE = 'ok\u001b]0;owned\u0007\u001b[2J\rforged\u009b31m\u202eevil\u200b';
/** A control (but a line break, where lines are the output's own) or an invisible format character. */
const UNSAFE = /[^\n\P{Cc}]|[\p{Cf}\p{Zl}\p{Zp}]/u;

let server: Server;
let endpoint: string;
let caPem: string;
/** What the stand-in concierge answers next: an HTTP status and a body. */
let answer: { status: number; body: object } = { status: 201, body: {} };

beforeAll(async () => {
  const ca = await newCA('hostile-proxy-ca');
  const cert = await issueCert(ca, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
  caPem = ca.certPem;
  server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    req.resume();
    req.on('end', () =>
      res.writeHead(answer.status, { 'content-type': 'application/json' }).end(JSON.stringify(answer.body)),
    );
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  endpoint = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((done) => server.close(done));
  const { closeHttpsPools } = await import('../lib/https-client.ts');
  await closeHttpsPools();
});

const failure = async (promise: Promise<unknown>): Promise<string> => {
  try {
    await promise;
  } catch (err) {
    return (err as Error).message;
  }
  throw new Error('it did not fail');
};
const exchangeFails = (): Promise<string> =>
  failure(exchange(endpoint, caPem, 'token', { kind: 'WebhookAuthenticator', name: 'hooks' }));

describe('server text reaches the terminal escaped', () => {
  it('a TokenCredentialRequest refused with a hostile message', async () => {
    answer = { status: 201, body: { status: { message: HOSTILE } } };
    const message = await exchangeFails();
    expect(message).toMatch(
      /^WebhookAuthenticator hooks refused the token on https:\/\/127\.0\.0\.1:\d+: ok\\u001b\]0;owned\\u0007/,
    );
    expect(message).not.toMatch(UNSAFE);
  });

  it('an error answer whose Status message is hostile, which is now shown', async () => {
    answer = { status: 401, body: { kind: 'Status', code: 401, message: HOSTILE } };
    const message = await exchangeFails();
    expect(message).toMatch(/^cannot exchange the token on https:\/\/127\.0\.0\.1:\d+: HTTP 401: ok\\u001b/);
    expect(message).not.toMatch(UNSAFE);
  });

  it('an issuer error, its description, an audience and a library message that quote the server', () => {
    const flags = { issuer: 'https://issuer.example.com', clientId: 'sealion-cli' };
    const said = [
      explain(Object.assign(new Error('x'), { error: HOSTILE, error_description: HOSTILE }), flags, 'login'),
      explain(
        Object.assign(new Error('openid-client says'), {
          code: 'OAUTH_JWT_CLAIM_COMPARISON_FAILED',
          cause: { claim: 'aud', claims: { aud: HOSTILE } },
        }),
        flags,
        'login',
      ),
      explain(Object.assign(new Error(HOSTILE), { code: 'OAUTH_RESPONSE_IS_NOT_CONFORM' }), flags, 'refresh'),
      explain(new Error(HOSTILE), flags, 'refresh'),
    ].map((e) => e.message);
    for (const message of said) {
      expect(message).toContain('ok\\u001b]0;owned');
      expect(message).not.toMatch(UNSAFE);
    }
  });

  it("the identity whoami prints, as a table, as YAML and as JSON that still parses to the server's values", async () => {
    const info: Whoami = {
      context: HOSTILE,
      cluster: HOSTILE,
      server: 'https://proxy.example.com',
      user: { username: HOSTILE, groups: [HOSTILE, 'readers'], extra: { [HOSTILE]: [HOSTILE] } },
    };
    const text = await whoamiOutput(info, 'table');
    expect(text).toMatch(
      /\nUsername +ok\\u001b\]0;owned\\u0007\\u001b\[2J\\u000dforged\\u009b31m\\u202eevil\\u200b\n/,
    );
    expect(text).not.toMatch(UNSAFE);
    const json = await whoamiOutput(info, 'json');
    expect(json).not.toMatch(UNSAFE);
    expect(JSON.parse(json)).toEqual(info);
    const yaml = await whoamiOutput(info, 'yaml');
    expect(yaml).not.toMatch(UNSAFE);
  });

  it("the strategies' messages, while waiting and when the proxy or the direct path failed", async () => {
    const entry = (type: string, reason: string, status: string) => ({
      type,
      status,
      reason,
      message: HOSTILE,
    });
    const authenticator = (...conciergeStrategies: object[]) => ({
      items: [{ metadata: { name: `corp${HOSTILE}` }, status: { conciergeStrategies } }],
    });
    let list = authenticator(entry('ImpersonationProxy', 'Pending', 'Error'));
    const clients = {
      customObjects: {
        listClusterCustomObject: ({ plural }: { plural: string }) =>
          Promise.resolve(plural === 'jwtauthenticators' ? list : { items: [] }),
      },
    } as unknown as KubeClients;
    const flags = { groupSuffix: 'sealion.dev', authenticatorType: '', authenticatorName: '', timeout: '0' };
    const said: string[] = [];
    const waited = await failure(findFrontend(clients, flags as GetKubeconfigFlags, (l) => said.push(l)));
    list = authenticator(entry('ImpersonationProxy', 'ErrorDuringSetup', 'Error'));
    const failed = await failure(findFrontend(clients, flags as GetKubeconfigFlags, () => {}));
    const named = await failure(
      findFrontend(clients, { ...flags, authenticatorName: 'other' } as GetKubeconfigFlags, () => {}),
    );
    list = authenticator(
      entry('ImpersonationProxy', 'Disabled', 'NotAvailable'),
      entry('TokenCredentialRequestAPI', `APIServiceUnavailable${HOSTILE}`, `Error${HOSTILE}`),
    );
    const neither = await failure(findFrontend(clients, flags as GetKubeconfigFlags, () => {}));
    const direct = await failure(
      findFrontend(clients, { ...flags, mode: 'direct' } as GetKubeconfigFlags, () => {}),
    );
    expect(direct).toMatch(/^the TokenCredentialRequest API is Error/);
    expect(neither).toMatch(
      /^the impersonation proxy is NotAvailable .*; the TokenCredentialRequest API is Error/,
    );
    for (const message of [waited, failed, named, neither, direct, ...said]) {
      expect(message).toContain('ok\\u001b]0;owned');
      expect(message).not.toMatch(UNSAFE);
    }
  });
});
