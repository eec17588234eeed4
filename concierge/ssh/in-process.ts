// The way SSH sessions enter the proxy's pipeline: an HTTP/1.1 server that listens on no port. Each connection to it
// is made in this process for one signed-in SSH session, and carries that session's identity as an object only this
// process holds (never a header, which a request could bring), so the pipeline skips authentication for its requests
// and runs every other stage as for kubectl's: the target cluster's decision, the route (hub, tunnel, peer), audit
// and recording. Plain HTTP clients and WebSocket clients use it through their `createConnection` option.
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { duplexPair, type Duplex } from 'node:stream';
import type { Request } from '../../lib/http2/request.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { OperationsRecording } from '../recording/session.ts';

/** Who an SSH session signed in as, as the pipeline's authentication stage would have found. */
export interface SignedIn {
  kind: 'user';
  user: UserInfo;
  /** How: `ssh/<authenticator>` after a device login, `ssh/key` for a bound key, `ssh/certificate`. */
  via: string;
  /** The recording of the session these requests are parts of (sftp's), which records them itself. Default: none. */
  recordedAs?: Pick<OperationsRecording, 'opened'>;
}

export interface InProcessDoor {
  /** A new connection into the pipeline as `identity`, from `remoteAddress` (the SSH client's, for audit). */
  connect(identity: SignedIn, remoteAddress: string): Duplex;
  /** Who a request that came through this door signed in as; undefined for every other request. */
  signedIn(req: Request): SignedIn | undefined;
  /** Where the door's requests go (the proxy handler's entry points); set once the handler exists. */
  serve(
    request: (req: IncomingMessage, res: ServerResponse) => void,
    upgrade: (req: IncomingMessage, socket: Socket, head: Buffer) => void,
  ): void;
  /** Ends every connection through the door. */
  close(): void;
}

export function newInProcessDoor(): InProcessDoor {
  const identities = new WeakMap<object, SignedIn>();
  const open = new Set<Duplex>();
  let onRequest: ((req: IncomingMessage, res: ServerResponse) => void) | undefined;
  let onUpgrade: ((req: IncomingMessage, socket: Socket, head: Buffer) => void) | undefined;
  const server = createServer((req, res) => {
    if (onRequest) return onRequest(req, res);
    res.writeHead(503).end();
  });
  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
    if (onUpgrade) return onUpgrade(req, socket, head);
    socket.destroy();
  });
  // The upgraded streams of a long shell live as long as their sessions; the pipeline bounds them itself.
  server.requestTimeout = 0;
  return {
    connect(identity, remoteAddress) {
      const [client, inside] = duplexPair();
      // What the pipeline reads of a socket: where the request came from, for its audit event.
      Object.defineProperty(inside, 'remoteAddress', { value: remoteAddress });
      identities.set(inside, identity);
      open.add(inside);
      // A stream pair ends each half only when the other is ended; a destroyed half (an exec killed, a forward's
      // channel gone) must take the pipeline's half with it, or the request it carries never finishes (its audit event,
      // its recording, its place in a tunnel's fair share).
      inside.once('close', () => {
        open.delete(inside);
        client.destroy();
      });
      client.once('close', () => inside.destroy());
      server.emit('connection', inside);
      return client;
    },
    signedIn(req) {
      const socket = 'stream' in req ? undefined : req.socket;
      return socket ? identities.get(socket) : undefined;
    },
    serve(request, upgrade) {
      onRequest = request;
      onUpgrade = upgrade;
    },
    close() {
      for (const stream of open) stream.destroy();
      open.clear();
    },
  };
}
