// `sealion agent`: runs the agent (what the agent Deployment's container runs).
import { Command, InvalidArgumentError, Option } from 'commander';
import type { TransportChoice } from '../lib/tunnel/dial.ts';
import type { AgentFlags } from '../agent/main.ts';
import { AGENT_DRAIN_SECONDS, AGENT_NAME } from '../apis/install.ts';

export function agentCommand(): Command {
  return new Command('agent')
    .description('run the agent: dial out to the hub and carry its requests to this cluster')
    .option('--cluster <name>', 'this cluster’s name in the hub (as given to sealion cluster add)', '')
    .option('--hub <url>', 'the hub’s tunnel listener, https://host:port', '')
    .option('--ca-bundle-data <base64>', 'the hub’s tunnel CA', '')
    .option('--ca-pin <sha256:hex>', 'or a pin of the tunnel CA’s public key', '')
    .option('--kubeconfig <path>', 'this cluster, as the agent (default: in-cluster)', '')
    .option('--namespace <name>', 'where the credentials Secret lives (default: $POD_NAMESPACE)', '')
    .option(
      '--credentials-secret <name>',
      'the Secret holding the agent’s key and certificate',
      `${AGENT_NAME}-credentials`,
    )
    .option(
      '--config-map <name>',
      'ConfigMap with clusterName, hubURL, caBundle, caPin (defaults for the flags)',
      '',
    )
    .option(
      '--token-env <name>',
      'environment variable with the one-time bootstrap token',
      'SEALION_BOOTSTRAP_TOKEN',
    )
    .addOption(
      new Option(
        '--tunnel-transport <transport>',
        'direct: HTTP/2 on the TLS connection; websocket: inside a WebSocket, for proxies that pass only those; auto: direct, else websocket',
      )
        .choices(['auto', 'direct', 'websocket'] satisfies TransportChoice[])
        .default('auto'),
    )
    .option(
      '--tunnels <n>',
      'tunnels to hold, each to another hub replica behind the one address (default: 2, at most 8)',
      (v: string) => {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError('a whole number, 1 or more');
        return n;
      },
    )
    .option(
      '--health-listen <host:port>',
      'plain-HTTP /healthz and /readyz (200 only while a tunnel is up) for the kubelet’s probes (off when empty)',
      '',
    )
    .option(
      '--shutdown-grace <seconds>',
      `on SIGTERM, the hub is told this agent leaves and the streams in flight get this long to end (default: ${AGENT_DRAIN_SECONDS})`,
      (v: string) => {
        const n = Number(v);
        if (v.trim() === '' || !Number.isInteger(n) || n < 0)
          throw new InvalidArgumentError('a whole number of seconds, 0 or more');
        return n;
      },
    )
    .option('--log-level <level>', 'trace, debug, info, warn or error', 'info')
    .addHelpText(
      'after',
      `
Examples:
  SEALION_BOOTSTRAP_TOKEN=abcd1234.… sealion agent --cluster edge-1 --hub https://hub.example.com:8444 \\
    --ca-pin sha256:3f… --namespace sealion-agent          # as sealion cluster add prints it`,
    )
    .action(async (flags: AgentFlags) => {
      const { runAgent } = await import('../agent/main.ts');
      const { onSignals } = await import('../lib/lifecycle.ts');
      // SIGTERM drains (the hub is told this agent leaves; streams in flight end), then exits 0; a second signal, or
      // SIGINT, stops at once.
      onSignals(await runAgent(flags), () => process.exit(0));
    });
}
