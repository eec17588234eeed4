import { describe, expect, it } from '@jest/globals';
import { Writable } from 'node:stream';
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
});
