import { describe, expect, it } from '@jest/globals';
import { coalescingStatusWriter, type StatusWriter } from './status-writer.ts';

interface S {
  connected?: boolean;
  since?: string;
  tunnels?: string[];
}

/** An inner writer whose writes finish when the test says so. */
function held(): {
  inner: StatusWriter<S>;
  writes: { name: string; status: Partial<S> }[];
  finish: () => void;
} {
  const writes: { name: string; status: Partial<S> }[] = [];
  const open: (() => void)[] = [];
  return {
    writes,
    inner: {
      patchStatus(name, status) {
        writes.push({ name, status });
        return new Promise((done) => open.push(done));
      },
    },
    finish: () => open.splice(0).forEach((done) => done()),
  };
}

const settle = (): Promise<void> => new Promise((r) => setImmediate(r));

describe('the coalescing status writer', () => {
  it('has at most its concurrency of writes in flight, and merges later changes into a waiting write', async () => {
    const { inner, writes, finish } = held();
    const writer = coalescingStatusWriter(inner, 2);
    const done: string[] = [];
    const write = (name: string, status: Partial<S>, label: string): void =>
      void writer.patchStatus(name, status).then(() => done.push(label));

    write('a', { connected: true, since: 't1', tunnels: ['r1'] }, 'a1');
    write('b', { connected: true }, 'b1');
    write('c', { connected: true, since: 't1', tunnels: ['r1'] }, 'c1');
    write('c', { connected: false, tunnels: [] }, 'c2');
    write('a', { connected: false, tunnels: [] }, 'a2');
    await settle();
    expect(writes).toEqual([
      { name: 'a', status: { connected: true, since: 't1', tunnels: ['r1'] } },
      { name: 'b', status: { connected: true } },
    ]);

    finish();
    await settle();
    // c's two changes went out as one write, as the API server would have applied them in turn; a's second change
    // waited for its first.
    expect(writes.slice(2)).toEqual([
      { name: 'c', status: { connected: false, since: 't1', tunnels: [] } },
      { name: 'a', status: { connected: false, tunnels: [] } },
    ]);
    expect(done.sort()).toEqual(['a1', 'b1']);
    finish();
    await settle();
    expect(done.sort()).toEqual(['a1', 'a2', 'b1', 'c1', 'c2']);
  });

  it('fails every change that a failed write carried, and goes on with the next', async () => {
    const failing: StatusWriter<S> = {
      patchStatus: (name) => (name === 'bad' ? Promise.reject(new Error('conflict')) : Promise.resolve()),
    };
    const writer = coalescingStatusWriter(failing, 1);
    const bad = writer.patchStatus('bad', { connected: true });
    const good = writer.patchStatus('good', { connected: true });
    await expect(bad).rejects.toThrow('conflict');
    await expect(good).resolves.toBeUndefined();
  });
});
