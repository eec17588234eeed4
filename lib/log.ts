// Structured logs with pino. Components get child loggers (`log.child({ component })`); messages are constant
// strings and data goes into fields. Anything that could hold a secret is redacted at every level.
import { pino, type Logger } from 'pino';

export type { Logger } from 'pino';

/** Field paths that never reach a log line, whatever a caller passes. */
export const REDACTED_PATHS = [
  'token',
  '*.token',
  'authorization',
  '*.authorization',
  'headers.authorization',
  'req.headers.authorization',
  'key',
  '*.key',
  'keyPem',
  '*.keyPem',
  'privateKey',
  '*.privateKey',
  'clientKeyData',
  '*.clientKeyData',
  'password',
  '*.password',
];

export interface LogOptions {
  /** Default: info. */
  level?: string;
  /** Where lines go. Default: stdout. */
  destination?: pino.DestinationStream;
  /**
   * Write to stdout asynchronously: the proxy logs a line per request, and a synchronous write per request
   * costs throughput. No minimum batch, so a quiet process's lines still appear at once. Default: false.
   */
  buffered?: boolean;
}

export function newLogger(opts: LogOptions = {}): Logger {
  return pino(
    { level: opts.level ?? 'info', redact: { paths: REDACTED_PATHS, censor: '[redacted]' }, base: undefined },
    opts.destination ?? (opts.buffered ? pino.destination({ sync: false }) : undefined),
  );
}

/** A logger that drops everything, for tests that do not look at logs. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
