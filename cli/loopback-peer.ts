// Who is at the other end of a loopback connection. The OIDC login's local server (login-oidc.ts) answers on
// 127.0.0.1, which every local user can reach: on Linux, the kernel's socket table says which user owns the socket
// that connected, so the login link and the callback can be refused to other users. Elsewhere, or when the table
// does not name the socket (another network namespace), nothing is known and nothing is refused for it.
import { readFileSync } from 'node:fs';

/** The socket tables of Linux, IPv4 and IPv6; the login server listens on 127.0.0.1, so the first one serves. */
const TABLES = ['/proc/net/tcp', '/proc/net/tcp6'];

/** A table's text, or '' where there is none (not Linux, or /proc not mounted). */
const readTable = (file: string): string => {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
};

/**
 * The user ID owning the socket that connected from `peerPort` to this process's `localPort`, or undefined when the
 * tables do not say. In a table, that socket is the line whose local port is the peer's and whose remote port is
 * ours (ports are hexadecimal after the colon; the uid is the eighth field).
 */
export function loopbackPeerUid(
  peerPort: number,
  localPort: number,
  tables: string[] = TABLES.map(readTable),
): number | undefined {
  const portOf = (address: string | undefined): number => parseInt(address?.split(':')[1] ?? '', 16);
  for (const table of tables)
    for (const line of table.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (portOf(fields[1]) === peerPort && portOf(fields[2]) === localPort) {
        const uid = Number(fields[7]);
        return Number.isInteger(uid) ? uid : undefined;
      }
    }
  return undefined;
}

/**
 * Whether a connection may come from another local user: its owner is known, is not this process's user, and is not
 * root (who can read this process's memory anyway, and owns the relays that forward a host's localhost into WSL or
 * a container).
 */
export function fromAnotherUser(peerPort: number, localPort: number, tables?: string[]): boolean {
  if (typeof process.getuid !== 'function') return false;
  const uid = loopbackPeerUid(peerPort, localPort, tables);
  return uid !== undefined && uid !== 0 && uid !== process.getuid();
}
