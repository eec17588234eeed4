import { describe, expect, it } from '@jest/globals';
import { newListenerSwitch } from './listener-switch.ts';
import { silentLogger } from './log.ts';

const settle = async (): Promise<void> => {
  for (let i = 0; i < 10; i++) await new Promise((done) => setImmediate(done));
};

/** A listener that records what happens to it; material 'bad' fails to load, and loads wait for `release()`. */
function recorder(restarts: boolean) {
  const events: string[] = [];
  let gate: Promise<void> = Promise.resolve();
  let open: () => void = () => {};
  const sw = newListenerSwitch<string>({
    name: 'test',
    identity: (m) => m,
    async load(m) {
      await gate;
      if (m === 'bad') throw new Error('does not parse');
      events.push(`load ${m}`);
    },
    ...(restarts ? { unload: () => Promise.resolve(void events.push('unload')) } : {}),
    switched: (on) => void events.push(on ? 'on' : 'off'),
    log: silentLogger(),
  });
  return {
    sw,
    events,
    hold: (): void => void (gate = new Promise((done) => (open = done))),
    release: () => open(),
  };
}

describe('a listener switch', () => {
  it('loads material once, and switching off and on again only flips the switch of one that swaps in place', async () => {
    const { sw, events } = recorder(false);
    sw.serve('a');
    sw.serve('a');
    await settle();
    sw.serve(undefined);
    await settle();
    sw.serve('a');
    await settle();
    expect(events).toEqual(['load a', 'on', 'off', 'on']);
    expect(sw.on()).toBe(true);
  });

  it('closes a restarting listener before a new load, when switched off and when the switch closes', async () => {
    const { sw, events } = recorder(true);
    sw.serve('a');
    await settle();
    sw.serve('b');
    await settle();
    sw.serve(undefined);
    await settle();
    sw.serve('b');
    await settle();
    await sw.close();
    sw.serve('c');
    await settle();
    expect(events).toEqual([
      'load a',
      'on',
      'off',
      'unload',
      'load b',
      'on',
      'off',
      'unload',
      'load b',
      'on',
      'unload',
    ]);
  });

  it('applies only the last of what was handed over while a load ran', async () => {
    const { sw, events, hold, release } = recorder(false);
    hold();
    sw.serve('a');
    await settle();
    sw.serve('b');
    sw.serve('c');
    release();
    await settle();
    expect(events).toEqual(['load a', 'load c', 'on']);
  });

  it('keeps what it held when new material fails, and tries that material again only when handed over again', async () => {
    const { sw, events } = recorder(false);
    sw.serve('a');
    await settle();
    sw.serve('bad');
    await settle();
    expect(events).toEqual(['load a', 'on']);
    expect(sw.on()).toBe(true);
    sw.serve('a');
    await settle();
    // 'a' is what it holds: nothing to load again.
    expect(events).toEqual(['load a', 'on']);
  });

  it('is off, holding nothing, when a restarting listener fails to load', async () => {
    const { sw, events } = recorder(true);
    sw.serve('a');
    await settle();
    sw.serve('bad');
    await settle();
    expect(events).toEqual(['load a', 'on', 'off', 'unload']);
    expect(sw.on()).toBe(false);
    sw.serve('a');
    await settle();
    expect(events).toEqual(['load a', 'on', 'off', 'unload', 'load a', 'on']);
  });
});
