// The byte stream the tunnel's HTTP/2 runs on when it runs inside a WebSocket (both ends: the agent's dial and the
// hub's listener).
//
// ws's own stream sends every chunk written to it as a message of its own. Node's HTTP/2 over a JavaScript stream
// writes each batch of frames as many chunks at once (a frame's 9-byte head and its payload apart, corked), so a
// 200-byte answer went as a handful of WebSocket frames, each its own TLS record and its own write to the socket, each
// masked apart on the agent's end. This stream sends a corked batch as one message (split at MESSAGE_BYTES), which
// costs one copy of the batch and saves a frame, a record and a system call per chunk.
import type { Duplex } from 'node:stream';
import { createWebSocketStream, type WebSocket } from 'ws';

/**
 * The largest message a batch is joined into: well under the listener's maxPayload (4 MiB), so that no batch is
 * refused for its size, and small enough that joining it costs no more memory than the chunks it joins.
 */
export const MESSAGE_BYTES = 256 * 1024;

type WriteCallback = (err?: Error | null) => void;

/** Groups `chunks` into runs of at most MESSAGE_BYTES (a larger chunk alone), each as one Buffer. */
export function messagesOf(chunks: Buffer[]): Buffer[] {
  const messages: Buffer[] = [];
  let run: Buffer[] = [];
  let size = 0;
  const flush = (): void => {
    if (run.length === 0) return;
    messages.push(run.length === 1 ? run[0]! : Buffer.concat(run, size));
    run = [];
    size = 0;
  };
  for (const chunk of chunks) {
    if (size + chunk.length > MESSAGE_BYTES) flush();
    run.push(chunk);
    size += chunk.length;
  }
  flush();
  return messages;
}

/** A binary stream over `ws` that sends each corked batch of writes as one message (or a few: MESSAGE_BYTES). */
export function webSocketStream(ws: WebSocket): Duplex {
  const duplex = createWebSocketStream(ws);
  duplex._writev = (chunks: { chunk: unknown }[], callback: WriteCallback): void => {
    if (ws.readyState !== ws.OPEN) {
      // Connecting (never, as both ends make the stream once open) or closing: as ws's stream does for one chunk.
      return duplex._write(
        Buffer.concat(chunks.map(({ chunk }) => chunk as Buffer)),
        'buffer' as BufferEncoding,
        callback,
      );
    }
    const messages = messagesOf(chunks.map(({ chunk }) => chunk as Buffer));
    let pending = messages.length;
    let failed = false;
    for (const message of messages)
      ws.send(message, { binary: true }, (err) => {
        if (failed) return;
        if (err) {
          failed = true;
          return callback(err);
        }
        if (--pending === 0) callback();
      });
  };
  return duplex;
}
