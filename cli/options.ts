// Options many commands share, declared once so that each says the same and completes the same.
import { Option, type Command } from 'commander';
import { takesNames } from './completion.ts';

/**
 * `--kubeconfig` and `--context`, meaning what kubectl's mean; `context` says what the context picks where a
 * command gives it more meaning (which login to forget, which clusters to ask). The context completes from the
 * kubeconfig.
 */
export function withKubeconfig(
  command: Command,
  context = 'the kubeconfig context to use (default: its current context)',
): Command {
  return command
    .option('--kubeconfig <path>', 'kubeconfig (default: $KUBECONFIG or ~/.kube/config)', '')
    .addOption(takesNames('context', new Option('--context <name>', context).default('')));
}

/** The -o option of the commands that print data: a table unless json or yaml is asked for. */
export const outputOption = (): Option =>
  new Option('-o, --output <format>', 'table, json or yaml')
    .choices(['table', 'json', 'yaml'])
    .default('table');
