// Ports a test must know before its server takes them. The rule is port 0: the system picks a free port as the server
// binds it, and the test reads it back, so no other process can take it in between. Two cases cannot do that: a server
// restarted on the port its clients already dial, and a test that sends requests before its server listens. Another
// process may hold such a port for a while (a server of another test file, or a port it picked and has not bound yet):
// those starts are tried again while their listen fails with EADDRINUSE.

/** Whether `err`, or an error it was caused by, is a listen refused because another socket holds the address. */
export function addressInUse(err: unknown): boolean {
  // Not `instanceof`: Node's own errors come from another realm than a Jest test's globals.
  for (let e = err; typeof e === 'object' && e !== null; e = (e as { cause?: unknown }).cause)
    if ((e as { code?: unknown }).code === 'EADDRINUSE') return true;
  return false;
}

/**
 * Runs `start` until it does not fail with EADDRINUSE, for up to `timeoutMs`, and returns what it returned; any other
 * failure, and the last EADDRINUSE, are thrown. `start` must leave nothing running when it fails; it may take a new
 * port each time, when any port known beforehand will do.
 */
export async function retryWhileAddressInUse<T>(start: () => Promise<T>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await start();
    } catch (err) {
      if (!addressInUse(err) || Date.now() > deadline) throw err;
    }
    await new Promise((r) => setTimeout(r, 250));
  }
}
