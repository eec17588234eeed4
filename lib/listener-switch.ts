// A listener whose material (certificates, a host key, the settings they come with) someone else decides, and hands
// over again and again as controllers sync: the impersonation proxy, the aggregated APIs' listener, the SSH door. One
// set of rules for all of them, so that they behave alike when material changes, goes away or does not load:
//
// - What is handed over last wins. Changes apply one at a time, in order; one handed over while another is loading
//   replaces whatever was waiting, so a listener never loads material that is already out of date.
// - Material equal (by `identity`) to what the listener holds is not loaded again: a controller may hand the same
//   material over on every sync at no cost, and switching off and on again only flips the switch.
// - A listener that swaps material in place (certificates) keeps its open connections, which go on with what they
//   started with; only new ones see the change, and switching off keeps the connections (the listener answers that
//   it does not serve). A listener that must restart for new material (`unload`: a new host key is a new server)
//   closes first, and its connections end with it; switching it off closes it too.
// - Material that fails to load is logged and not retried until it is handed over again; the listener keeps what it
//   held and its switch stays as it was (a restarting listener has closed: it holds nothing and is off).
import type { Logger } from './log.ts';

export interface ListenerSwitchOptions<M> {
  /** Names the listener in the log. */
  name: string;
  /** What in `m` takes a load to apply; material of equal identity is loaded once. */
  identity(m: M): string;
  /** Makes the listener hold `m`: certificates swapped in, or a server started with them. A throw: see above. */
  load(m: M): Promise<void> | void;
  /**
   * Lets go of what the listener holds: a restarting listener closes its server (before a new load, when switched
   * off, and when the switch closes). Default: none, material is swapped in place.
   */
  unload?(): Promise<void>;
  /** The switch flipped: serving what it holds, or not. Default: nothing to tell. */
  switched?(on: boolean): void;
  log: Logger;
}

export interface ListenerSwitch<M> {
  /** What the listener should serve now; undefined: switched off. Returns at once; the change applies in order. */
  serve(material: M | undefined): void;
  /** Whether it serves now. */
  on(): boolean;
  /** Waits for the change under way, then lets go of what the listener holds; nothing applies after. */
  close(): Promise<void>;
}

export function newListenerSwitch<M>(opts: ListenerSwitchOptions<M>): ListenerSwitch<M> {
  const { log, name } = opts;
  /** The identity last handed over ('' for off), and the one the listener holds ('' for nothing). */
  let wanted = '';
  let held = '';
  let on = false;
  let closed = false;
  let applying = Promise.resolve();

  const flip = (next: boolean): void => {
    if (next === on) return;
    on = next;
    log.info({ listener: name }, next ? 'listener switched on' : 'listener switched off');
    opts.switched?.(next);
  };
  const release = async (): Promise<void> => {
    held = '';
    await opts.unload?.();
  };
  const apply = async (material: M | undefined, key: string): Promise<void> => {
    // Replaced while it waited: the newer material is queued behind.
    if (closed || key !== wanted) return;
    if (!material) {
      flip(false);
      if (opts.unload && held) await release();
      return;
    }
    if (key !== held) {
      if (opts.unload && held) {
        flip(false);
        await release();
      }
      try {
        await opts.load(material);
        held = key;
      } catch (err) {
        wanted = '';
        return void log.error(
          { listener: name, err: (err as Error).message },
          'new serving material failed to load; the listener keeps what it held',
        );
      }
    }
    if (key === wanted) flip(true);
  };

  return {
    serve(material) {
      if (closed) return;
      const key = material ? opts.identity(material) : '';
      if (key === wanted) return;
      wanted = key;
      applying = applying
        .then(() => apply(material, key))
        .catch((err: unknown) =>
          log.error({ listener: name, err: (err as Error).message }, 'the listener could not switch'),
        );
    },
    on: () => on,
    async close() {
      closed = true;
      await applying;
      if (held && opts.unload) await release();
    },
  };
}
