// A TokenReview webhook over real HTTPS, as a WebhookAuthenticator calls one: tests hand it identities (any username,
// groups, uid or extras, hostile ones included) and get tokens that it answers for. It also remembers every token
// it was asked about, so a test can tell which credentials the concierge disclosed to it.
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { issueCert, newCA } from '../../lib/pki/pki.ts';

export interface WebhookUser {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

export interface TokenWebhook {
  url: string;
  /** The CA of its serving certificate, base64-encoded, as `spec.tls.certificateAuthorityData` wants it. */
  caData: string;
  /** A new token this webhook answers with `user`. */
  grant(user: WebhookUser): string;
  /** Whether the webhook was ever sent this token. */
  received(token: string): boolean;
  stop(): Promise<void>;
}

/** TokenReview bodies are a token and some boilerplate; this bounds what the harness buffers. */
const MAX_REVIEW_BYTES = 256 * 1024;

export async function startTokenWebhook(): Promise<TokenWebhook> {
  const ca = await newCA('test-token-webhook-ca');
  const serving = await issueCert(ca, { commonName: 'token-webhook', hosts: ['127.0.0.1'], usage: 'server' });
  const users = new Map<string, WebhookUser>();
  const received = new Set<string>();

  const server = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_REVIEW_BYTES) req.destroy();
      else chunks.push(chunk);
    });
    req.on('end', () => {
      let token = '';
      try {
        const review = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { spec?: { token?: unknown } };
        token = typeof review.spec?.token === 'string' ? review.spec.token : '';
      } catch {
        // Not a TokenReview: answered as an unknown token.
      }
      if (token) received.add(token);
      const user = users.get(token);
      const status = user
        ? {
            authenticated: true,
            user: {
              username: user.username,
              ...(user.uid === undefined ? {} : { uid: user.uid }),
              groups: user.groups ?? [],
              ...(user.extra === undefined ? {} : { extra: user.extra }),
            },
          }
        : { authenticated: false, error: 'unknown token' };
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', status }));
    });
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}/authenticate`;

  return {
    url,
    caData: Buffer.from(ca.certPem).toString('base64'),
    grant(user) {
      const token = `hook-${randomBytes(24).toString('base64url')}`;
      users.set(token, user);
      return token;
    },
    received: (token) => received.has(token),
    stop: () =>
      new Promise<void>((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}
