/** Retries `fn` until it stops throwing or `timeoutMs` passes; then throws its last error. Use instead of sleeps. */
export async function eventually<T>(
  fn: () => Promise<T> | T,
  timeoutMs = 20_000,
  intervalMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, intervalMs));
    }
  }
}
