// The floor under any impersonating proxy written for Node, for the proxy benchmark: an HTTP/2 relay that sends
// every request on as the bench user, with the client's headers, the concierge's forwarding token and the
// Impersonate-* headers Sealion sends, over Sealion's own pool of upstream connections (h2-pool.ts). It does
// nothing else: no authentication, no header checks, no logs, no metrics, no timeouts. Between it and Sealion lies
// the cost of the proxy's own work; between it and direct access, the cost of Node's HTTP/2 and TLS.
// Arguments: the harness cluster's folder and URL. Reads the headers to forward with (the token and Impersonate-*
// headers, as JSON) as the first line on stdin; prints one JSON line {url, servingCA} when ready.
import { readFileSync } from 'node:fs';
import { constants, createSecureServer, type OutgoingHttpHeaders } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { createSecureContext } from 'node:tls';
import { newH2Pool } from '../lib/http2/pool.ts';
import { issueCert, loadCA } from '../lib/pki/pki.ts';

const [dir, url] = process.argv.slice(2) as [string, string];
const input = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const forwarded = JSON.parse((await input.next()).value as string) as OutgoingHttpHeaders;
const ca = await loadCA(readFileSync(join(dir, 'ca.crt'), 'utf8'), readFileSync(join(dir, 'ca.key'), 'utf8'));
const serving = await issueCert(ca, { commonName: 'bench-relay', hosts: ['127.0.0.1'], usage: 'server' });
const pool = newH2Pool(new URL(url).origin, { secureContext: createSecureContext({ ca: ca.certPem }) });

const server = createSecureServer({ cert: serving.certPem, key: serving.keyPem });
server.on('stream', (stream, headers) => {
  stream.on('error', () => {});
  // The client's own headers go on, as Sealion sends them, credentials aside. Accept-Encoding matters most: a
  // client that accepts gzip has the API server hold back a LIST until it knows whether to compress it.
  const request: OutgoingHttpHeaders = { ':method': headers[':method'], ':path': headers[':path'] };
  for (const name in headers)
    if (name.charCodeAt(0) !== 58 /* ':' */ && name !== 'authorization' && !name.startsWith('impersonate-'))
      request[name] = headers[name];
  const upstream = pool.request(Object.assign(request, forwarded), true);
  upstream.on('response', (answer) => {
    const out: Record<string, unknown> = {};
    for (const name in answer) if (name.charCodeAt(0) !== 58 /* ':' */) out[name] = answer[name];
    stream.respond({ ...out, ':status': answer[':status'] });
    upstream.pipe(stream);
  });
  upstream.on('error', () => stream.close(constants.NGHTTP2_INTERNAL_ERROR));
});
server.on('connection', (socket: { setNoDelay(on: boolean): void }) => socket.setNoDelay(true));
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address() as AddressInfo;
  console.log(JSON.stringify({ url: `https://127.0.0.1:${port}`, servingCA: ca.certPem }));
});
