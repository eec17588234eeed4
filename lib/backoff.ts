// How long to wait before trying again after `failures` failures in a row: `minMs` after the first, doubling up to
// `maxMs`. Callers add their own jitter, which depends on who else retries at the same moment.
export function exponentialBackoff(failures: number, minMs: number, maxMs: number): number {
  return Math.min(maxMs, minMs * 2 ** Math.max(0, failures - 1));
}
