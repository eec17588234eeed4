// The `sealion` command: one binary, one subcommand per job. kubectl starts `sealion login` for every command it
// runs, so a run loads only the module of the subcommand it names; heavy modules load inside the commands that
// use them. Help, or a name that is no subcommand, loads them all, and so does completing a line (completion.ts).
// Run as kubectl-sealion (a kubectl plugin), help and usage say `kubectl sealion`; run as kubectl_complete-sealion,
// it answers kubectl's completion requests.
//
// No top-level await: the standalone executable runs this as CommonJS (dev/build-cli.ts).
import { enableCompileCache } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { isSea } from 'node:sea';
import type { Command } from 'commander';
import { AlreadySaid, errorLine } from './errors.ts';
import { printable } from './printable.ts';
import { displayName, invokedName, PLUGIN_COMMAND_NAME, PLUGIN_COMPLETION_NAME } from './self.ts';

/** The command the CLI was started as, which completion scripts complete: sealion, or the plugin's name. */
const scriptName = invokedName() === PLUGIN_COMMAND_NAME ? PLUGIN_COMMAND_NAME : 'sealion';

/** Each subcommand's module, in the order help lists them. */
const COMMANDS: Record<string, () => Promise<Command>> = {
  manifests: async () => (await import('./manifests.ts')).manifestsCommand(),
  concierge: async () => (await import('./concierge.ts')).conciergeCommand(),
  login: async () => (await import('./login.ts')).loginCommand(),
  logout: async () => (await import('./logout.ts')).logoutCommand(),
  get: async () => (await import('./get-kubeconfig.ts')).getCommand(),
  whoami: async () => (await import('./whoami.ts')).whoamiCommand(),
  'port-forward': async () => (await import('./port-forward.ts')).portForwardCommand(),
  ssh: async () => (await import('./ssh.ts')).sshCommand(),
  clusters: async () => (await import('./clusters.ts')).clustersCommand(),
  auth: async () => (await import('./can-i.ts')).authCommand(),
  cluster: async () => (await import('./cluster.ts')).clusterCommand(),
  agent: async () => (await import('./agent.ts')).agentCommand(),
  recordings: async () => (await import('./recordings.ts')).recordingsCommand(),
  request: async () => (await import('./request.ts')).requestCommand(),
  version: async () => (await import('./version.ts')).versionCommand(),
  completion: async () => (await import('./completion.ts')).completionCommand(scriptName),
};

/** The words of help that name the command (usage, examples) name it as the plugin, when kubectl runs it as one. */
function asPlugin(command: Command, name: string): void {
  const rename = (text: string): string =>
    text.replace(/(^|[\s(;&|])(?<!kubectl )sealion(?= )/gm, `$1${name}`);
  command.configureOutput({
    writeOut: (text) => process.stdout.write(rename(text)),
    writeErr: (text) => process.stderr.write(rename(text)),
  });
  for (const sub of command.commands) asPlugin(sub, name);
}

/** Runs the command line `argv` (as process.argv: node, script, then the arguments). */
async function runCli(argv: string[]): Promise<void> {
  // The version alone needs neither commander nor any subcommand (`sealion version` says more).
  if ((argv[2] === '--version' || argv[2] === '-V') && invokedName(argv) !== PLUGIN_COMPLETION_NAME) {
    process.stdout.write(`${(await import('../lib/version.ts')).SEALION_VERSION}\n`);
    return;
  }
  const { Command } = await import('commander');
  const name = displayName(argv, process.env);
  const program = new Command(name)
    .description('Sealion: kubectl access to many clusters through an authenticating, impersonating proxy')
    .showHelpAfterError()
    // Answered before anything loads (above); declared so that help lists it.
    .option('-V, --version', 'print the CLI version and exit');
  // kubectl runs kubectl_complete-sealion with the words after `kubectl sealion`: a completion request.
  const words = invokedName(argv) === PLUGIN_COMPLETION_NAME ? argv.slice(2) : undefined;
  const named = words ? undefined : argv[2];
  const wanted = named !== undefined && Object.hasOwn(COMMANDS, named) ? [named] : Object.keys(COMMANDS);
  for (const command of await Promise.all(wanted.map((key) => COMMANDS[key]!()))) program.addCommand(command);
  // The line being completed is the words', not commander's to parse (a --help in it must not print help).
  if (words || named === '__complete') {
    const { answerCompletion } = await import('./completion.ts');
    return answerCompletion(program, words ?? argv.slice(3));
  }
  (await import('./help.ts')).sayEachDefaultOnce(program);
  if (name !== 'sealion') asPlugin(program, name);
  await program.parseAsync(argv);
}

// Node's compile cache keeps V8's compiled code of every module loaded from here on (and, in the checkout, the
// TypeScript with its types stripped) for the next run: the modules (commander included, hence its dynamic import)
// then load several times faster. It lives in the user's own cache folder, not the shared temporary one Node
// defaults to, where another user could plant compiled code; NODE_DISABLE_COMPILE_CACHE=1 turns it off. A
// standalone executable has nothing to load from disk and carries its own code cache.
if (!isSea())
  enableCompileCache(
    join(process.env['XDG_CACHE_HOME'] || join(homedir(), '.cache'), 'sealion', 'node-compile-cache'),
  );

/** An error message longer than this is cut: a library may have put a whole answer's body in it. */
const MAX_ERROR_LENGTH = 2000;

runCli(process.argv).catch((err: unknown) => {
  // Every failure is one line in the one style (errors.ts), never a stack trace: a command's own words, or a system
  // or library error put in words there. A login plugin that failed has said why on standard error already. The
  // message may hold server text that no command escaped (a library's error quoting an answer), so it is made
  // printable here too; text escaped already stays as it is.
  if (!(err instanceof AlreadySaid)) console.error(`sealion: ${printable(errorLine(err), MAX_ERROR_LENGTH)}`);
  process.exitCode = 1;
});
