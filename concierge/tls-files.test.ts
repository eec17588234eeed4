import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventually } from '../dev/eventually.ts';
import { newControllerManager, type ControllerManager } from '../lib/controller/manager.ts';
import { silentLogger } from '../lib/log.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { fakeClock, type FakeClock } from '../test-support/fake-clock.ts';
import { loadTLSFiles, type TLSFiles, type TLSMaterial } from './tls-files.ts';

/** A serving certificate and the signer's CA, written where `files` say. */
async function writeSet(files: TLSFiles, name: string): Promise<void> {
  const signer = await newCA(`${name} signer`);
  const cert = await issueCert(signer, { commonName: name, hosts: ['localhost'], usage: 'server' });
  await writeFile(files.certFile, cert.certPem);
  await writeFile(files.keyFile, cert.keyPem);
  await writeFile(files.signerCertFile, signer.certPem);
  await writeFile(files.signerKeyFile, signer.keyPem);
}

describe('the TLS files poll', () => {
  let dir: string;
  let files: TLSFiles;
  let clock: FakeClock;
  let manager: ControllerManager;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sealion-tls-files-'));
    files = {
      certFile: join(dir, 'tls.crt'),
      keyFile: join(dir, 'tls.key'),
      signerCertFile: join(dir, 'signer.crt'),
      signerKeyFile: join(dir, 'signer.key'),
      clientCAFiles: [],
    };
    clock = fakeClock();
    manager = newControllerManager({ log: silentLogger(), clock });
  });
  afterEach(async () => {
    await manager.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it('reads the files before start, then on the manager clock, applying only a set that changed', async () => {
    await writeSet(files, 'first');
    const applied: TLSMaterial[] = [];
    const { initial, poll } = await loadTLSFiles(files, (next) => applied.push(next), silentLogger());
    expect(initial.tls.certPem).toContain('BEGIN CERTIFICATE');
    manager.run(poll);
    await manager.start();
    await manager.idle(poll.name);
    expect(applied).toHaveLength(0);

    await writeSet(files, 'second');
    // Not read again before its turn: nothing changes until the clock moves.
    await manager.idle(poll.name);
    expect(applied).toHaveLength(0);
    clock.advance(10_000);
    await eventually(() => expect(applied).toHaveLength(1));
    expect(applied[0]!.tls.certPem).not.toBe(initial.tls.certPem);
  });

  it('fails the start when the files cannot be read', async () => {
    await expect(loadTLSFiles(files, () => {}, silentLogger())).rejects.toThrow(/ENOENT/);
  });
});
