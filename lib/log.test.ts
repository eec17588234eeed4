import { describe, expect, it } from '@jest/globals';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { eventually } from '../dev/eventually.ts';
import { flatLineLogger, newLogger, type Logger } from './log.ts';

function capture(): { log: Logger; lines: () => Record<string, unknown>[] } {
  let text = '';
  const log = newLogger({
    destination: new Writable({
      write(chunk: Buffer, _enc, next) {
        text += chunk.toString();
        next();
      },
    }),
  });
  return {
    log,
    lines: () =>
      text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

describe('logs', () => {
  it('redact tokens, keys and passwords at the top level and one level down', () => {
    const { log, lines } = capture();
    log.info(
      {
        token: 'secret-1',
        authorization: 'Bearer secret-2',
        spec: { token: 'secret-3', password: 'secret-4' },
        req: { headers: { authorization: 'Bearer secret-5' } },
        tls: { keyPem: 'secret-6', certPem: 'public' },
      },
      'a line',
    );
    const text = JSON.stringify(lines());
    expect(text).not.toMatch(/secret-/);
    expect(lines()[0]).toMatchObject({ token: '[redacted]', spec: { token: '[redacted]' } });
    expect(lines()[0]).toMatchObject({ tls: { certPem: 'public' } });
  });

  it('redact the same names in a flat line', () => {
    const { log, lines } = capture();
    flatLineLogger(log.child({ component: 'proxy' })).info(
      { user: 'alice', token: 'secret-1', authorization: 'Bearer secret-2', clientKeyData: 'secret-3' },
      'request',
    );
    expect(JSON.stringify(lines())).not.toMatch(/secret-/);
    expect(lines()[0]).toMatchObject({ component: 'proxy', user: 'alice', token: '[redacted]' });
  });

  it('write buffered lines whole and in order, a line longer than one write among them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sealion-log-'));
    try {
      const file = join(dir, 'buffered.log');
      const log = newLogger({ buffered: true, file });
      const long = 'x'.repeat(20_000);
      for (let i = 0; i < 300; i++) log.info({ i, ...(i === 150 ? { long } : {}) }, 'line');
      log.flush();
      await eventually(() => {
        const lines = readFileSync(file, 'utf8').trim().split('\n');
        expect(lines).toHaveLength(300);
        const parsed = lines.map((l) => JSON.parse(l) as { i: number; long?: string });
        expect(parsed.map((l) => l.i)).toEqual([...Array(300).keys()]);
        expect(parsed[150]!.long).toBe(long);
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
