import type { SFTPWrapper } from 'ssh2';
import type { Containers } from './containers.ts';
import type { Logger } from '../../lib/log.ts';
export function serveSftp(sftp: SFTPWrapper, _containers: Containers, _options: { log: Logger }): void {
  sftp.end();
}
