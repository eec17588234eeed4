import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from '@jest/globals';
import { WebSocket, type RawData } from 'ws';
import { startNetnsBackend, type NetnsBackend } from './harness/netns.ts';

const run = promisify(execFile);

async function namespaces(): Promise<string[]> {
  const { stdout } = await run('ip', ['netns', 'list']);
  return stdout
    .split('\n')
    .map((line) => line.split(' ')[0] ?? '')
    .filter(Boolean);
}

async function interfaceExists(name: string): Promise<boolean> {
  return run('ip', ['link', 'show', 'dev', name]).then(
    () => true,
    () => false,
  );
}

async function hello(backend: NetnsBackend): Promise<{ status: number; type: string | null; body: string }> {
  const res = await fetch(`http://${backend.ip}:${backend.port}/hello`);
  return { status: res.status, type: res.headers.get('content-type'), body: await res.text() };
}

/** Sends each message in turn and collects the echo of each, with whether it came back as binary. */
async function echo(
  url: string,
  messages: (string | Buffer)[],
): Promise<{ data: Buffer; binary: boolean }[]> {
  const socket = new WebSocket(url);
  try {
    await new Promise((done, fail) => {
      socket.once('open', done);
      socket.once('error', fail);
    });
    const replies: { data: Buffer; binary: boolean }[] = [];
    for (const message of messages) {
      const reply = new Promise<{ data: Buffer; binary: boolean }>((done, fail) => {
        socket.once('message', (data: RawData, binary: boolean) =>
          done({ data: Buffer.isBuffer(data) ? data : Buffer.from(data as ArrayBuffer), binary }),
        );
        socket.once('error', fail);
      });
      socket.send(message, { binary: typeof message !== 'string' });
      replies.push(await reply);
    }
    return replies;
  } finally {
    socket.close();
  }
}

describe('startNetnsBackend', () => {
  it('serves HTTP and WebSocket at a non-loopback address and leaves nothing behind', async () => {
    const backend = await startNetnsBackend();
    try {
      expect(backend.ip).toMatch(/^10\.200\.\d+\.\d+$/);
      expect(await namespaces()).toContain(backend.netns);
      expect(await interfaceExists(backend.hostInterface)).toBe(true);

      expect(await hello(backend)).toEqual({
        status: 200,
        type: 'text/plain',
        body: `hello from ${backend.ip}`,
      });

      const binary = Buffer.from([0, 1, 2, 0xfe, 0xff]);
      const replies = await echo(`ws://${backend.ip}:${backend.port}/echo`, ['ping', binary]);
      expect(replies).toEqual([
        { data: Buffer.from('ping'), binary: false },
        { data: binary, binary: true },
      ]);
    } finally {
      await backend.stop();
    }

    expect(await namespaces()).not.toContain(backend.netns);
    expect(await interfaceExists(backend.hostInterface)).toBe(false);
    // A second stop() finds nothing to remove, which is not an error.
    await backend.stop();
  });

  it('gives concurrent backends different subnets', async () => {
    const backends = await Promise.all([startNetnsBackend(), startNetnsBackend()]);
    try {
      const [a, b] = backends;
      expect(a.ip).not.toBe(b.ip);
      expect(a.netns).not.toBe(b.netns);
      expect(a.hostInterface).not.toBe(b.hostInterface);
      for (const backend of backends) {
        expect((await hello(backend)).body).toBe(`hello from ${backend.ip}`);
        const [reply] = await echo(`ws://${backend.ip}:${backend.port}/any/path`, [backend.ip]);
        expect(reply).toEqual({ data: Buffer.from(backend.ip), binary: false });
      }
    } finally {
      await Promise.all(backends.map((backend) => backend.stop()));
    }
    const left = await namespaces();
    for (const backend of backends) {
      expect(left).not.toContain(backend.netns);
      expect(await interfaceExists(backend.hostInterface)).toBe(false);
    }
  });
});
