// The `sealion` command: one binary, one subcommand per job. Heavy modules load inside the commands that use
// them: kubectl starts `sealion login` for every command it runs.
import { Command } from 'commander';
import { conciergeCommand } from './concierge.ts';
import { getCommand } from './get-kubeconfig.ts';
import { loginCommand } from './login.ts';
import { whoamiCommand } from './whoami.ts';
import { agentCommand } from './agent.ts';
import { clusterCommand } from './cluster.ts';
import { manifestsCommand } from './manifests.ts';

const program = new Command('sealion')
  .description('Sealion: kubectl access to many clusters through an authenticating, impersonating proxy')
  .showHelpAfterError();

program.addCommand(manifestsCommand());
program.addCommand(conciergeCommand());
program.addCommand(loginCommand());
program.addCommand(getCommand());
program.addCommand(whoamiCommand());
program.addCommand(clusterCommand());
program.addCommand(agentCommand());

try {
  await program.parseAsync(process.argv);
} catch (err) {
  // Expected failures (bad flags, unreachable clusters) print one line, not a stack trace.
  console.error(`sealion: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
