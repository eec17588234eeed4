// Listening as every server here listens: one promise that resolves with the port bound (0 asks for any) once the
// server listens, or rejects with why it cannot (EADDRINUSE, EACCES); the error handler is the start's alone, so an
// error after the start is the caller's to handle, not a settled promise's to swallow.
import type { AddressInfo, Server } from 'node:net';

export function listenOn(server: Server, port: number, host: string): Promise<number> {
  return new Promise((done, fail) => {
    server.once('error', fail);
    server.listen(port, host, () => {
      server.off('error', fail);
      done((server.address() as AddressInfo).port);
    });
  });
}
