import { describe, expect, it } from '@jest/globals';
import { ensureStoredCA, storedCA, tlsSecret, type StoredCA } from './ca-secret.ts';

describe('a CA kept in a Secret', () => {
  it('reads back what was written, with the CA it replaced', () => {
    const secret = tlsSecret('ns', 'signer', { certPem: 'CERT', keyPem: 'KEY', previousPem: 'OLD' });
    expect(secret).toMatchObject({
      type: 'kubernetes.io/tls',
      metadata: { name: 'signer', namespace: 'ns' },
    });
    expect(storedCA(secret.data)).toEqual({ certPem: 'CERT', keyPem: 'KEY', previousPem: 'OLD' });
    expect(storedCA({ 'tls.crt': secret.data['tls.crt']! })).toBeUndefined();
    expect(storedCA(undefined)).toBeUndefined();
  });

  it('is created once: a replica that loses the race uses the winner’s', async () => {
    let stored: StoredCA | undefined;
    const winner = await ensureStoredCA(
      () => Promise.resolve(stored),
      (ca) => ((stored = ca), Promise.resolve(true)),
      'test CA',
    );
    expect(winner.certPem).toContain('BEGIN CERTIFICATE');
    // The loser read nothing, made its own, and found the Secret taken when it tried to create it.
    let reads = 0;
    const loser = await ensureStoredCA(
      () => Promise.resolve(reads++ === 0 ? undefined : stored),
      () => Promise.resolve(false),
      'test CA',
    );
    expect(loser).toEqual(winner);
  });
});
