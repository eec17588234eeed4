// `sealion recordings`: the exec and attach sessions the concierge recorded (asciicast v2), listed and played back
// through the impersonation proxy, for people whom the hub's RBAC lets list and get sessionrecordings in Sealion's
// recordings group. Every replica's recordings are listed, whichever replica answers.
import { Argument, Command } from 'commander';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import { closeHttpsPools } from '../lib/https-client.ts';
import { takesNames } from './completion.ts';
import { failureOf } from './exec-credential.ts';
import { printable, printableJSONText } from './printable.ts';
import { loginFirst, requestAsKubeconfig } from './whoami.ts';

interface RecordingsFlags {
  kubeconfig: string;
  groupSuffix: string;
}

interface SessionRecordingList {
  metadata?: { unreachableReplicas?: string[] };
  items?: {
    metadata: { name: string; creationTimestamp: string };
    status: { replica: string; bytes: number };
  }[];
}

/** The largest recording a replica keeps by default is 32 MiB; room for a larger limit. */
const MAX_RECORDING_BYTES = 256 * 1024 * 1024;

async function fetchFromProxy(flags: RecordingsFlags, rest: string, accept: string): Promise<string> {
  const { loadKubeConfig } = await import('../lib/kube/kube.ts');
  const config = loadKubeConfig(flags.kubeconfig ? { path: flags.kubeconfig } : { default: true });
  await loginFirst(config);
  const group = apiGroups(flags.groupSuffix).recordings;
  try {
    return await requestAsKubeconfig(config, `apis/${group}/${VERSION}/${Resource.SessionRecording}${rest}`, {
      accept,
      maxBytes: MAX_RECORDING_BYTES,
      timeoutMs: 120_000,
    });
  } catch (err) {
    throw new Error(`recordings: ${await failureOf(err)}`, { cause: err });
  } finally {
    await closeHttpsPools();
  }
}

/** The table `recordings list` prints: every value is the server's text, made printable. */
export function recordingsTable(list: SessionRecordingList): string {
  const rows = (list.items ?? []).map((r) => [
    printable(r.metadata.name, 64),
    printable(r.metadata.creationTimestamp, 40),
    printable(r.status.replica, 64),
    printable(String(r.status.bytes), 20),
  ]);
  const header = ['ID', 'MODIFIED', 'REPLICA', 'BYTES'];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => c.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  const unreachable = list.metadata?.unreachableReplicas ?? [];
  return [
    line(header),
    ...rows.map(line),
    ...(unreachable.length > 0
      ? [`(replicas that did not answer: ${unreachable.map((r) => printable(r, 64)).join(', ')})`]
      : []),
  ].join('\n');
}

export function recordingsCommand(): Command {
  const command = new Command('recordings').description(
    'list and play back recorded exec and attach sessions (asciicast v2)',
  );
  const common = (c: Command): Command =>
    c
      .option('--kubeconfig <path>', 'kubeconfig (default: $KUBECONFIG or ~/.kube/config)', '')
      .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX);
  command.addCommand(
    common(new Command('list').description('the recorded sessions, newest first')).action(
      async (flags: RecordingsFlags) => {
        const list = JSON.parse(await fetchFromProxy(flags, '', 'application/json')) as SessionRecordingList;
        process.stdout.write(`${recordingsTable(list)}\n`);
      },
    ),
  );
  command.addCommand(
    common(new Command('play').description('play a recorded session back in this terminal'))
      .addArgument(takesNames('recording', new Argument('<id>', "the recording (the session's audit ID)")))
      .option('--speed <factor>', 'play faster (2) or slower (0.5)', '1')
      .option('--max-idle <seconds>', 'shorten longer pauses to this', '2')
      .option('--raw', 'print the recording itself (asciicast v2, for asciinema play)', false)
      .action(
        async (id: string, flags: RecordingsFlags & { speed: string; maxIdle: string; raw: boolean }) => {
          const speed = Number(flags.speed);
          const maxIdle = Number(flags.maxIdle);
          if (!(speed > 0))
            throw new Error(`--speed: ${JSON.stringify(flags.speed)} is not a positive number`);
          if (!(maxIdle > 0))
            throw new Error(`--max-idle: ${JSON.stringify(flags.maxIdle)} is not a positive number`);
          const text = await fetchFromProxy(flags, `/${encodeURIComponent(id)}`, 'application/x-asciicast');
          // The file as it is to anything that reads JSON, with the control characters JSON leaves raw escaped.
          if (flags.raw) return void process.stdout.write(printableJSONText(text));
          const { parseAsciicast, play } = await import('../concierge/recording/playback.ts');
          // play() passes only text and the sequences a replay needs: the recorded session cannot command this terminal.
          await play(parseAsciicast(text), process.stdout, { speed, maxIdleSeconds: maxIdle });
        },
      ),
  );
  return command.addHelpText(
    'after',
    `
Examples:
  sealion recordings list --kubeconfig me.kubeconfig
  sealion recordings play 0b8f0c1e-5d7a-4c1e-9a57-3f2f5f7c9e11 --speed 4
The hub's RBAC decides who may: verbs list and get on ${Resource.SessionRecording} in API group
recordings.concierge.<suffix>, as the install's ClusterRole sealion-concierge-session-auditor grants:
  kubectl create clusterrolebinding session-auditors --clusterrole=sealion-concierge-session-auditor --group=auditors`,
  );
}
