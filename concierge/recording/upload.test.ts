// Finished recordings sent to a receiver on a real socket, named by a kubeconfig as the audit webhook is.
import { afterEach, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { eventually } from '../../dev/eventually.ts';
import { silentLogger } from '../../lib/log.ts';
import { issueCert, newCA } from '../../lib/pki/pki.ts';
import { newWebhookClient } from '../audit/sinks.ts';
import { newRecordingUploader, type RecordingUploader } from './upload.ts';

const ID = '0b8f0c1e-5d7a-4c1e-9a57-3f2f5f7c9e11';

describe('recordings sent to a receiver', () => {
  let server: Server | undefined;
  let uploader: RecordingUploader | undefined;
  let dir: string | undefined;
  afterEach(async () => {
    await uploader?.close();
    await new Promise<void>((done) => (server ? server.close(() => done()) : done()));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('POSTs each finished recording with its audit ID and the kubeconfig token, retrying a 503', async () => {
    const ca = await newCA('recording receiver CA');
    const serving = await issueCert(ca, { commonName: 'receiver', hosts: ['127.0.0.1'], usage: 'server' });
    const got: { id: string; type: string; token: string; body: string }[] = [];
    let refusals = 1;
    server = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (body += c));
      req.on('end', () => {
        if (refusals-- > 0) return void res.writeHead(503).end();
        got.push({
          id: String(req.headers['x-sealion-audit-id']),
          type: String(req.headers['content-type']),
          token: String(req.headers['authorization']),
          body,
        });
        res.writeHead(201).end();
      });
    });
    await new Promise<void>((done) => server!.listen(0, '127.0.0.1', done));
    dir = mkdtempSync(join(tmpdir(), 'sealion-upload-'));
    const kubeconfig = join(dir, 'kubeconfig');
    writeFileSync(
      kubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [
          {
            name: 'receiver',
            cluster: {
              server: `https://127.0.0.1:${(server.address() as AddressInfo).port}/recordings`,
              'certificate-authority-data': Buffer.from(ca.certPem).toString('base64'),
            },
          },
        ],
        users: [{ name: 'sealion', user: { token: 'receiver-token' } }],
      }),
    );
    const cast = '{"version":2,"width":80,"height":24}\n[0.1,"o","hello"]\n';
    writeFileSync(join(dir, `${ID}.cast`), cast);
    uploader = newRecordingUploader(
      await newWebhookClient({ kubeconfigPath: kubeconfig, initialBackoffMs: 1 }, 'recording webhook'),
      silentLogger(),
    );
    uploader.add(ID, join(dir, `${ID}.cast`));
    await eventually(() =>
      expect(got).toEqual([
        { id: ID, type: 'application/x-asciicast', token: 'Bearer receiver-token', body: cast },
      ]),
    );
  });
});
