// The one start and stop of the concierge and the agent, with parts that only record what happens to them.
import { describe, expect, it } from '@jest/globals';
import { newLifecycle, type OnStop } from './lifecycle.ts';
import { silentLogger } from './log.ts';

/** A start that starts `parts` in order, recording each start and stop in `events`. */
function partsStart(events: string[], parts: string[], fail?: string) {
  return (onStop: OnStop): Promise<string> => {
    for (const part of parts) {
      if (part === fail) throw new Error(`${part} failed`);
      events.push(`start ${part}`);
      onStop(() => events.push(`stop ${part}`));
    }
    return Promise.resolve('started');
  };
}

describe('a lifecycle', () => {
  it('stops its parts in the reverse order, once however often it is told', async () => {
    const events: string[] = [];
    const lifecycle = newLifecycle('test', silentLogger(), partsStart(events, ['a', 'b', 'c']));
    expect(await lifecycle.start()).toBe('started');
    await Promise.all([lifecycle.stop(), lifecycle.stop()]);
    await lifecycle.stop();
    expect(events).toEqual(['start a', 'start b', 'start c', 'stop c', 'stop b', 'stop a']);
  });

  it('stops what had started when a part fails to start, and rejects', async () => {
    const events: string[] = [];
    const lifecycle = newLifecycle('test', silentLogger(), partsStart(events, ['a', 'b', 'c'], 'c'));
    await expect(lifecycle.start()).rejects.toThrow('c failed');
    expect(events).toEqual(['start a', 'start b', 'stop b', 'stop a']);
  });

  it('runs every stop step even when one fails', async () => {
    const events: string[] = [];
    const lifecycle = newLifecycle('test', silentLogger(), (onStop) => {
      onStop(() => events.push('stop a'));
      onStop(() => Promise.reject(new Error('b will not stop')));
      onStop(() => events.push('stop c'));
      return Promise.resolve();
    });
    await lifecycle.start();
    await lifecycle.stop();
    expect(events).toEqual(['stop c', 'stop a']);
  });

  it('stopped while it starts, stops the part that comes next too and goes no further', async () => {
    const events: string[] = [];
    let release: () => void = () => {};
    const lifecycle = newLifecycle('test', silentLogger(), async (onStop) => {
      events.push('start a');
      onStop(() => events.push('stop a'));
      await new Promise<void>((done) => (release = done));
      events.push('start b');
      onStop(() => events.push('stop b'));
      events.push('start c');
    });
    const starting = lifecycle.start();
    const stopping = lifecycle.stop();
    release();
    await expect(starting).rejects.toThrow('the test was stopped while it started');
    await stopping;
    await new Promise((done) => setImmediate(done));
    expect(events).toEqual(['start a', 'stop a', 'start b', 'stop b']);
  });
});

describe("a lifecycle's drain", () => {
  it('runs the drain sequence, then the stop, once however often it is told', async () => {
    const events: string[] = [];
    const lifecycle = newLifecycle('test', silentLogger(), (onStop, onDrain) => {
      onStop(() => events.push('stop a'));
      onDrain(() => (events.push('drain'), Promise.resolve()));
      return Promise.resolve();
    });
    await lifecycle.start();
    await Promise.all([lifecycle.drain(), lifecycle.drain()]);
    expect(events).toEqual(['drain', 'stop a']);
  });

  it('a stop during the drain aborts its waits and stops at once', async () => {
    const events: string[] = [];
    const lifecycle = newLifecycle('test', silentLogger(), (onStop, onDrain) => {
      onStop(() => events.push('stop a'));
      onDrain(
        (signal) =>
          new Promise<void>((done) => signal.addEventListener('abort', () => (events.push('cut'), done()))),
      );
      return Promise.resolve();
    });
    await lifecycle.start();
    const draining = lifecycle.drain();
    await lifecycle.stop();
    await draining;
    expect(events).toEqual(['cut', 'stop a']);
  });

  it('without a drain sequence, drain is a stop', async () => {
    const events: string[] = [];
    const lifecycle = newLifecycle('test', silentLogger(), partsStart(events, ['a']));
    await lifecycle.start();
    await lifecycle.drain();
    expect(events).toEqual(['start a', 'stop a']);
  });
});
