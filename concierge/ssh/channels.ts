// What a signed-in SSH connection may open: sessions (a shell, the menu, a command, sftp) and `-L` forwards. Each is one
// or more requests through the proxy's pipeline as the connection's identity (cluster-access.ts), so the target
// cluster decides, and audit and recording apply; channels per connection are bounded.
import { finished } from 'node:stream/promises';
import type { Connection, ServerChannel, Session } from 'ssh2';
import type { Logger } from '../../lib/log.ts';
import { oneLine } from './banner.ts';
import type { OperationsRecording, Recordings } from '../recording/session.ts';
import { join } from '../../lib/streams/join.ts';
import { newClusterAccess, Refused, type ClusterAccess } from './cluster-access.ts';
import type { ContainerRef, Terminal } from './containers.ts';
import type { DoorConnection } from './door-connection.ts';
import type { InProcessDoor, SignedIn } from './in-process.ts';
import { chooseContainer } from './menu.ts';
import { serveSftp } from './sftp.ts';
import { parseExecCommand, parseForward } from './target.ts';

export interface ChannelDeps {
  door: InProcessDoor;
  /** What targets call the hub's own cluster now. */
  hubName: () => string;
  /** The Cluster objects' names. */
  clusterNames: () => string[];
  groupSuffix: string;
  /** Channels (sessions and forwards) at once per connection. */
  channelsPerConnection: number;
  /** Where sftp sessions are recorded, each as one recording of its operations. Default: not recorded. */
  recordings?: Pick<Recordings, 'openOperations'>;
  log: Logger;
}

/** The shell started when the user names no command: bash where the image has it. */
const SHELL = ['/bin/sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi'];

const USAGE =
  'Sealion: name a container, as in\r\n' +
  '  ssh -t <user>@<this host> <cluster>/<namespace>/<pod>[/<container>]\r\n' +
  '  ssh <user>@<this host> <cluster>/<namespace>/<pod>[/<container>] -- <command> [args]\r\n' +
  'or connect with a terminal (ssh -t) for a menu.\r\n';

export function serveSignedIn(
  client: Connection,
  conn: DoorConnection,
  identity: SignedIn,
  software: string,
  deps: ChannelDeps,
): void {
  const state = conn.signIn;
  // Everything the connection started ends with it: execs, forwards, the menu's lookups.
  const ended = new AbortController();
  conn.onClose(() => ended.abort());
  const accessAs = (who: SignedIn): ClusterAccess =>
    newClusterAccess({
      signal: ended.signal,
      connect: () => deps.door.connect(who, conn.ip),
      hubName: deps.hubName(),
      clusterNames: deps.clusterNames,
      groupSuffix: deps.groupSuffix,
      userAgent: `sealion-ssh (${software})`,
    });
  const access = accessAs(identity);
  // An sftp session is one recording of its operations; the commands it runs are its parts, not recordings apart.
  const forSftp = (): SftpAccess => {
    const recording = deps.recordings?.openOperations({ user: identity.user.username, kind: 'sftp' });
    return recording ? { access: accessAs({ ...identity, recordedAs: recording }), recording } : { access };
  };
  let channels = 0;
  const take = (): boolean => (channels < deps.channelsPerConnection ? (channels++, true) : false);
  const give = (): void => void channels--;
  /** Sessions' stderr, for what a refused forward cannot say itself (SSH's open failure carries no text). */
  const notices = new Set<ServerChannel>();
  const notify = (line: string): void => {
    for (const channel of notices) if (channel.stderr.writable) channel.stderr.write(noticeOf(line));
  };

  client.on('session', (accept, reject) => {
    if (!take()) return reject();
    const session = accept();
    session.once('close', give);
    serveSession(session, access, forSftp, state.permits, identity, notices, deps.log);
  });
  client.on('tcpip', (accept, reject, info) => {
    const refuse = (reason: number, why: string): void => rejectOpen(client, reject, reason, why);
    if (!state.permits.portForwarding)
      return refuse(
        OPEN_FAILURE.AdministrativelyProhibited,
        'your certificate does not permit port forwarding',
      );
    const dest = parseForward(info.destIP, info.destPort);
    if ('problem' in dest) {
      notify(`-L ${info.destIP}:${info.destPort}: ${dest.problem}`);
      return refuse(OPEN_FAILURE.ConnectFailed, dest.problem);
    }
    if (!take())
      return refuse(
        OPEN_FAILURE.ResourceShortage,
        `at most ${deps.channelsPerConnection} channels per connection`,
      );
    access.reach(dest.cluster, dest.target).then(
      (socket) => {
        // The client may have gone while the cluster decided.
        const channel = ended.signal.aborted ? undefined : accept();
        if (!channel) {
          give();
          return void socket.destroy();
        }
        channel.once('close', give);
        // Closed at once, without a byte written: a close is a message of the connection, not of the channel.
        if (tooSmallPackets(outgoingOf(channel))) {
          socket.destroy();
          return void channel.close();
        }
        // Bytes both ways, each end passed on as a half-close, a channel or a connection cut short cutting the other.
        join(channel, socket);
      },
      (err: unknown) => {
        give();
        const why = (err as Error).message;
        notify(`-L ${info.destIP}:${info.destPort}: ${why}`);
        refuse(openFailureOf(err), why);
      },
    );
  });
  // -R would put a listener inside a cluster fed from the client: see the README for why the door has none.
  client.on('request', (_accept, reject) => reject?.());
}

/** RFC 4254 section 5.1's reason codes for a channel that could not be opened. */
export const OPEN_FAILURE = {
  AdministrativelyProhibited: 1,
  ConnectFailed: 2,
  ResourceShortage: 4,
} as const;

/** The reason code for a refused forward: the cluster's refusal (403), its limits (429, 503), or no way through. */
function openFailureOf(err: unknown): number {
  const status = err instanceof Refused ? err.status : 0;
  if (status === 401 || status === 403) return OPEN_FAILURE.AdministrativelyProhibited;
  if (status === 429 || status === 503) return OPEN_FAILURE.ResourceShortage;
  return OPEN_FAILURE.ConnectFailed;
}

/** A line for the client longer than this is cut: it is one line the client prints. */
const MAX_CLIENT_LINE = 512;

/**
 * Text the client prints, made one line: it may quote a cluster's Status message, hostile until made so, and a PTY
 * would run its escape sequences (a title, a hyperlink, the screen cleared). Costs the message's line breaks.
 */
const clientLine = (text: string): string => oneLine(text).slice(0, MAX_CLIENT_LINE);

/** The line a session's stderr gets for a forward refused (SSH's open failure carries no text to print). */
export function noticeOf(line: string): string {
  return `sealion: ${clientLine(line)}\r\n`;
}

/**
 * Refuses a channel with a reason code and its description, which OpenSSH prints (`open failed: connect failed:
 * <description>`). ssh2's `reject()` always sends an empty description, so its one call to the protocol's
 * channelOpenFail is given ours for the moment it runs: that call is synchronous, and nothing else writes meanwhile.
 */
function rejectOpen(client: Connection, reject: () => void, reason: number, description: string): void {
  const protocol = (client as unknown as { _protocol?: { channelOpenFail?: OpenFail } })._protocol;
  const original = protocol?.channelOpenFail;
  if (!protocol || typeof original !== 'function') return reject();
  const text = clientLine(description);
  protocol.channelOpenFail = (recipient) => original.call(protocol, recipient, reason, text);
  try {
    reject();
  } finally {
    protocol.channelOpenFail = original;
  }
}
type OpenFail = (recipient: number, reason: number, description: string) => void;

/** What an sftp session works through, and its recording when sessions are recorded. */
interface SftpAccess {
  access: ClusterAccess;
  recording?: OperationsRecording;
}

function serveSession(
  session: Session,
  access: ClusterAccess,
  forSftp: () => SftpAccess,
  permits: { pty: boolean },
  identity: SignedIn,
  notices: Set<ServerChannel>,
  log: Logger,
): void {
  let pty: Terminal | undefined;
  let resize: ((size: { cols: number; rows: number }) => void) | undefined;
  /**
   * A session runs one thing (a shell, a command or sftp); a second request for one is refused, and so is every one of
   * a session whose client takes packets too small to write to.
   */
  let started = tooSmallPackets(outgoingOf(session));
  const begin = (accept: (() => ServerChannel | undefined) | undefined): ServerChannel | undefined => {
    if (started || !accept) return undefined;
    started = true;
    const channel = accept();
    if (channel) {
      // A client that goes while its command runs leaves writes that fail: they have nobody to tell.
      channel.on('error', () => {});
      channel.stderr.on('error', () => {});
      notices.add(channel);
      channel.once('close', () => notices.delete(channel));
    }
    return channel;
  };
  session.on('pty', (accept, reject, info) => {
    if (!permits.pty) return reject?.();
    pty = { cols: info.cols, rows: info.rows, term: info.term };
    accept?.();
  });
  session.on('window-change', (accept, _reject, info) => {
    if (pty) Object.assign(pty, { cols: info.cols, rows: info.rows });
    resize?.({ cols: info.cols, rows: info.rows });
    accept?.();
  });
  session.on('env', (_accept, reject) => reject?.());
  session.on('shell', (accept, reject) => {
    const channel = begin(accept);
    if (!channel) return reject?.();
    if (!pty) return fail(channel, USAGE, 2);
    const terminal = pty;
    menu(channel, access, identity, (target) =>
      runIn(channel, access, target, [], terminal, (r) => (resize = r)),
    ).catch((err: unknown) => fail(channel, `${(err as Error).message}\r\n`, 1));
  });
  session.on('exec', (accept, reject, info) => {
    const channel = begin(accept);
    if (!channel) return reject?.();
    const parsed = parseExecCommand(info.command);
    if ('problem' in parsed) {
      const legacyScp = /^scp( |$)/.test(info.command);
      return fail(
        channel,
        legacyScp
          ? 'sealion: scp runs over sftp here (the default since OpenSSH 9.0): drop -O\r\n'
          : `sealion: ${parsed.problem}\r\n${parsed.usage ? USAGE : ''}`,
        2,
      );
    }
    void runIn(channel, access, parsed.target, parsed.argv, pty, (r) => (resize = r)).then((refused) => {
      if (refused) fail(channel, `sealion: ${refused.line}\r\n`, refused.code);
    });
  });
  session.on('sftp', (accept, reject) => {
    if (started || !accept) return reject?.();
    started = true;
    const sftp = accept();
    if (!sftp) return;
    const recorded = forSftp();
    serveSftp(sftp, recorded.access, {
      log,
      ...(recorded.recording ? { recording: recorded.recording } : {}),
    });
  });
  session.on('subsystem', (_accept, reject) => reject?.());
}

/**
 * The menu, then a shell in the container picked; a container the shell cannot start in (none in its image) says so
 * in one line and the menu comes back, as a refused exec does.
 */
async function menu(
  channel: ServerChannel,
  access: ClusterAccess,
  identity: SignedIn,
  shell: (target: ContainerRef) => Promise<Refusal | undefined>,
): Promise<void> {
  let greeting = `Sealion: signed in as ${identity.user.username}.`;
  for (;;) {
    const target = await chooseContainer(channel, access, greeting);
    if (channel.destroyed) return;
    if (!target) return fail(channel, '', 0);
    channel.write(
      `\r\nConnecting to ${target.cluster}/${target.namespace}/${target.pod}/${target.container}…\r\n`,
    );
    const refused = await shell(target);
    if (!refused || channel.destroyed) return;
    greeting = `sealion: ${refused.line}`;
  }
}

/**
 * The smallest packet a channel's client may ask for. ssh2 cuts what it writes into packets of the client's maximum
 * packet size, and loops for ever on a maximum of 0; clients ask for 32 KiB (OpenSSH, ssh2) or 16 KiB (PuTTY). A
 * channel whose client asks for less is refused what would write to it (a command, a shell, sftp) or, for a forward,
 * closed before anything is written.
 */
const MIN_PACKET_BYTES = 512;

/** What the client said of a channel it opened: ssh2 keeps it on the channel (and on a session before its channel). */
function outgoingOf(channel: object): { packetSize?: unknown } | undefined {
  const opened = channel as {
    outgoing?: { packetSize?: unknown };
    _chanInfo?: { outgoing?: { packetSize?: unknown } };
  };
  return opened.outgoing ?? opened._chanInfo?.outgoing;
}

function tooSmallPackets(outgoing: { packetSize?: unknown } | undefined): boolean {
  const size = outgoing?.packetSize;
  return typeof size !== 'number' || size < MIN_PACKET_BYTES;
}

/** Ends a channel with a message on stderr and an exit status. */
function fail(channel: ServerChannel, message: string, code: number): void {
  if (message && channel.stderr.writable) channel.stderr.write(message);
  exit(channel, code);
}

/**
 * Sends the exit status and ends the channel, unless it has ended already. ssh2 throws when the connection went
 * meanwhile (a compressor or a cipher gone): the channel then has nobody to tell.
 */
function exit(channel: ServerChannel, code: number): void {
  if (!channel.writable) return;
  try {
    channel.exit(code);
    channel.end();
  } catch {
    channel.destroy();
  }
}

/** Why a command did not run: one line for the person, and the exit status it ends with. */
export interface Refusal {
  line: string;
  code: number;
}

/** What the container runtime says when the program to exec is not in the image (runc's and containerd's words). */
const NO_PROGRAM =
  /(?:exec: "[^"]*": (?:stat [^:]*: )?(?:no such file or directory|executable file not found in \$PATH))|executable file not found/;

/**
 * The line and exit status for an exec that could not run. A program the image does not have is said in one line,
 * with the status a shell gives for a command it cannot find (127), not as the runtime's nested "Internal error
 * occurred: … OCI runtime exec failed" text; any other refusal is the cluster's Status message, as kubectl prints it.
 */
export function refusalOf(err: unknown, target: ContainerRef, argv: readonly string[]): Refusal {
  const refusal = refusalAsIs(err, target, argv);
  // The line is said after `sealion: `; a message of Sealion's own (a draining replica's) starts with it already.
  return { ...refusal, line: clientLine(refusal.line).replace(/^sealion: /, '') };
}

/** refusalOf's line before it is made one line for the client. */
function refusalAsIs(err: unknown, target: ContainerRef, argv: readonly string[]): Refusal {
  const message = err instanceof Error ? err.message : String(err);
  const where = `${target.cluster}/${target.namespace}/${target.pod}${target.container ? `/${target.container}` : ''}`;
  if (NO_PROGRAM.test(message))
    return argv.length === 0
      ? {
          line: `${where} has no shell (/bin/sh in its image); pick another container, or run a program it has: ssh <host> ${where} -- <command>`,
          code: 127,
        }
      : { line: `${argv[0]}: no such program in ${where}`, code: 127 };
  return { line: message, code: 1 };
}

/**
 * Runs a command (or, with no argv, a shell) in the container and ties it to the channel: input, output, terminal
 * size, and the exit status. Resolves once the channel has its exit status, or with why the command could not run
 * (the channel is then left open, and its input no longer goes anywhere).
 */
function runIn(
  channel: ServerChannel,
  access: ClusterAccess,
  target: ContainerRef,
  argv: string[],
  pty: Terminal | undefined,
  onResize: (resize: (size: { cols: number; rows: number }) => void) => void,
): Promise<Refusal | undefined> {
  const running = access.run(target, argv.length > 0 ? argv : SHELL, pty);
  onResize((size) => running.resize(size));
  channel.pipe(running.stdin);
  channel.resume();
  running.stdout.pipe(channel, { end: false });
  running.stderr.pipe(channel.stderr, { end: false });
  const kill = (): void => running.kill();
  channel.once('close', kill);
  return running.exit.then(
    async (code) => {
      await Promise.all([finished(running.stdout), finished(running.stderr)]).catch(() => {});
      exit(channel, code);
      return undefined;
    },
    (err: unknown) => {
      channel.unpipe(running.stdin);
      running.stdout.unpipe(channel);
      running.stderr.unpipe(channel.stderr);
      channel.off('close', kill);
      channel.pause();
      return refusalOf(err, target, argv);
    },
  );
}
