// The menu an SSH user gets with a terminal and no target: the clusters, then the namespaces where that cluster lets
// them exec into pods, then the running pods, then (if more than one) the containers, each picked by number or name.
// The door owns the terminal until a shell starts (there is no remote line discipline yet), so this file echoes what
// is typed and reads a line itself.
import type { Duplex } from 'node:stream';
import type { ContainerRef, Containers } from './containers.ts';

/** A line longer than this is cut off: names are at most 253 characters. */
const MAX_LINE = 256;
const CTRL_C = 0x03;
const CTRL_D = 0x04;
const BACKSPACE = new Set([0x08, 0x7f]);
const ESC = 0x1b;

/** Reads one line typed on the terminal, echoing it; undefined when the person quits (Ctrl-C, Ctrl-D, hang-up). */
export function readLine(terminal: Duplex): Promise<string | undefined> {
  return new Promise((done) => {
    let line = '';
    /** Inside an escape sequence (an arrow key, say), whose bytes are skipped. */
    let escaping = false;
    const finish = (value: string | undefined): void => {
      terminal.off('data', onData);
      terminal.off('close', onClose);
      terminal.off('end', onClose);
      terminal.pause();
      done(value);
    };
    const onClose = (): void => finish(undefined);
    const onData = (chunk: Buffer): void => {
      for (const byte of chunk) {
        if (escaping) {
          // A CSI sequence ends with a byte from @ to ~; a lone ESC-x pair ends at x.
          if (byte >= 0x40 && byte <= 0x7e && byte !== 0x5b) escaping = false;
          continue;
        }
        if (byte === ESC) escaping = true;
        else if (byte === CTRL_C || byte === CTRL_D) {
          terminal.write('\r\n');
          return finish(undefined);
        } else if (byte === 0x0d || byte === 0x0a) {
          terminal.write('\r\n');
          return finish(line.trim());
        } else if (BACKSPACE.has(byte)) {
          if (line.length > 0) {
            line = line.slice(0, -1);
            terminal.write('\b \b');
          }
        } else if (byte >= 0x20 && byte < 0x7f && line.length < MAX_LINE) {
          line += String.fromCharCode(byte);
          terminal.write(String.fromCharCode(byte));
        }
      }
    };
    terminal.on('data', onData);
    terminal.once('close', onClose);
    terminal.once('end', onClose);
    terminal.resume();
  });
}

/** An empty line: go back a level. */
const BACK = Symbol('back');

/**
 * Lets the person pick one of `choices`: the item, BACK for an empty line, or undefined when they quit. A choice
 * is its number or its name.
 */
async function pick(
  terminal: Duplex,
  title: string,
  choices: readonly string[],
): Promise<string | typeof BACK | undefined> {
  terminal.write(`\r\n${title}\r\n`);
  choices.forEach((c, i) => terminal.write(`  ${String(i + 1).padStart(3)}) ${c}\r\n`));
  for (;;) {
    terminal.write('Choose by number or name (empty line: back, Ctrl-D: quit): ');
    const answer = await readLine(terminal);
    if (answer === undefined) return undefined;
    if (answer === '') return BACK;
    const byNumber = /^[0-9]+$/.test(answer) ? choices[Number(answer) - 1] : undefined;
    const chosen = byNumber ?? choices.find((c) => c === answer);
    if (chosen) return chosen;
    terminal.write(`There is no "${answer}" here.\r\n`);
  }
}

/**
 * Walks the person from clusters down to a container. Lists come from the clusters as the user sees them; one that
 * fails says why and goes back a level. Undefined when they quit.
 */
export async function chooseContainer(
  terminal: Duplex,
  containers: Containers,
  greeting: string,
): Promise<ContainerRef | undefined> {
  terminal.write(`${greeting}\r\n`);
  const path: string[] = [];
  for (;;) {
    const [cluster, namespace, pod] = path as [string?, string?, string?];
    let title: string;
    let listing: Promise<string[]>;
    if (cluster === undefined) {
      title = 'Clusters:';
      listing = containers.clusters();
    } else if (namespace === undefined) {
      title = `Namespaces of ${cluster} where you may exec into pods:`;
      listing = containers.namespaces(cluster);
    } else if (pod === undefined) {
      title = `Running pods in ${cluster}/${namespace}:`;
      listing = containers.pods(cluster, namespace);
    } else {
      title = `Containers of ${cluster}/${namespace}/${pod}:`;
      listing = containers.containers(cluster, namespace, pod);
    }
    let choices: string[];
    try {
      terminal.write(`\r\n(asking ${cluster ?? 'the hub'}…)`);
      choices = await listing;
      if (terminal.destroyed) return undefined;
      terminal.write('\r\x1b[K');
    } catch (err) {
      terminal.write(`\r\x1b[K${title} ${(err as Error).message}\r\n`);
      if (path.length === 0) return undefined;
      path.pop();
      continue;
    }
    if (pod !== undefined && choices.length === 1)
      return { cluster: cluster!, namespace: namespace!, pod, container: choices[0]! };
    if (choices.length === 0) {
      terminal.write(`${title} none.\r\n`);
      if (path.length === 0) return undefined;
      path.pop();
      continue;
    }
    const chosen = await pick(terminal, title, choices);
    if (chosen === undefined) return undefined;
    if (chosen === BACK) {
      if (path.length === 0) return undefined;
      path.pop();
      continue;
    }
    if (pod !== undefined) return { cluster: cluster!, namespace: namespace!, pod, container: chosen };
    path.push(chosen);
  }
}
