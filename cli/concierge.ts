// `sealion concierge`: runs the concierge (what the Deployment's container runs).
import { Command } from 'commander';
import { DEFAULT_GROUP_SUFFIX } from '../apis/groups.ts';
import type { ConciergeFlags } from '../concierge/main.ts';
import { DEFAULT_SHUTDOWN_DELAY_SECONDS, DEFAULT_SHUTDOWN_GRACE_SECONDS } from '../concierge/drain.ts';
import {
  API_SERVICE,
  CONFIG_MAP_NAME,
  IMPERSONATOR_SERVICE_ACCOUNT,
  PROXY_PORT,
  TUNNEL_PORT,
  PEER_PORT,
} from '../apis/install.ts';

export function conciergeCommand(): Command {
  return new Command('concierge')
    .description('run the concierge: authenticator controllers and the impersonation proxy')
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .option('--listen <host:port>', 'impersonation proxy listener', `0.0.0.0:${PROXY_PORT}`)
    .option('--metrics-listen <host:port>', 'plain-HTTP /metrics listener (off when empty)', '')
    .option(
      '--aggregated-api-listen <host:port>',
      "the aggregated APIs' listener, which the cluster's API server reaches through --aggregated-api-service (off when empty)",
      '',
    )
    .option(
      '--ssh-listen <host:port>',
      "where the SSH door listens when the ConfigMap's ssh.mode is enabled (no door when empty)",
      '',
    )
    .option(
      '--aggregated-api-service <name>',
      "the Service in the concierge's namespace that the APIServices name (port 443)",
      API_SERVICE,
    )
    .option('--kubeconfig <path>', "the concierge's own identity (default: in-cluster)", '')
    .option(
      '--upstream-kubeconfig <path>',
      'identity requests are forwarded with (default: TokenRequest tokens, in cluster)',
      '',
    )
    .option(
      '--impersonator-service-account <name>',
      'service account whose tokens forward requests, in cluster',
      IMPERSONATOR_SERVICE_ACCOUNT,
    )
    .option(
      '--tls-cert-file <path>',
      "serve this certificate (PEM, reloaded when it changes) instead of the controllers' (default: controllers)",
      '',
    )
    .option('--tls-key-file <path>', 'serving key (PEM)', '')
    .option(
      '--client-ca-file <path>',
      'extra CA trusted for client certificates (repeatable)',
      (v: string, all: string[]) => [...all, v],
      [] as string[],
    )
    .option('--signer-cert-file <path>', 'CA that signs TokenCredentialRequest certificates (PEM)', '')
    .option('--signer-key-file <path>', 'its key (PEM)', '')
    .option(
      '--tunnel-listen <host:port>',
      "the agents' tunnel listener (off when empty)",
      `0.0.0.0:${TUNNEL_PORT}`,
    )
    .option(
      '--tunnel-host <name>',
      'a name or address agents dial the tunnel at, for its certificate (repeatable)',
      (v: string, all: string[]) => [...all, v],
      [] as string[],
    )
    .option(
      '--peer-listen <host:port>',
      "the listener other replicas send requests for this replica's tunnels to (with the tunnel listener)",
      `0.0.0.0:${PEER_PORT}`,
    )
    .option(
      '--peer-advertise <host>',
      'the address other replicas dial the peer listener at (default: $POD_IP, else the listen host)',
      '',
    )
    .option('--log-level <level>', 'trace, debug, info, warn or error', 'info')
    .option('--namespace <name>', "the concierge's namespace (default: $POD_NAMESPACE)", '')
    .option('--config-map <name>', 'ConfigMap with config.yaml (read by the controllers)', CONFIG_MAP_NAME)
    .option('--audit-policy-file <path>', 'audit.k8s.io/v1 Policy; no file there: audit off', '')
    .option('--audit-log-path <path>', "audit events as JSON lines to this file ('-': standard output)", '')
    .option('--audit-log-maxsize <MiB>', 'rotate the audit log at this size', '100')
    .option('--audit-log-maxbackup <n>', 'rotated audit logs kept', '10')
    .option('--audit-log-maxage <days>', 'days a rotated audit log is kept (0: no limit)', '0')
    .option('--audit-webhook-config-file <path>', 'kubeconfig-format file naming the audit webhook', '')
    .option(
      '--audit-mode <mode>',
      'batch: a slow sink never slows requests (full buffer: dropped, counted); blocking: refuse what cannot be audited',
      'batch',
    )
    .option('--recordings-dir <path>', 'record exec and attach sessions (asciicast v2) here; empty: off', '')
    .option(
      '--recording-stdin',
      'record what users type, too (off: passwords typed at a prompt stay out)',
      false,
    )
    .option('--recording-required', 'refuse an exec or attach that cannot be recorded', false)
    .option('--recording-max-size <MiB>', "one session's recording stops at this size", '32')
    .option(
      '--recording-webhook-config-file <path>',
      'kubeconfig-format file naming a receiver that finished recordings are also POSTed to',
      '',
    )
    .option(
      '--access-webhook-config-file <path>',
      'kubeconfig-format file naming a receiver that each access request change is POSTed to ({type, object})',
      '',
    )
    .option(
      '--shutdown-delay <seconds>',
      'on SIGTERM, readiness turns off and the replica serves on this long, while Endpoints and load balancers forget it',
      String(DEFAULT_SHUTDOWN_DELAY_SECONDS),
    )
    .option(
      '--shutdown-grace <seconds>',
      'then, with no new connections, exec, attach, port-forward, reach and SSH sessions get this long before each is closed with a message',
      String(DEFAULT_SHUTDOWN_GRACE_SECONDS),
    )
    .option('--no-log-usernames', 'keep usernames and groups out of operational logs (audit keeps them)')
    .addHelpText(
      'after',
      `
Examples:
  sealion concierge                                   # in a cluster, as the Deployment runs it
  sealion concierge --kubeconfig admin.kubeconfig --upstream-kubeconfig impersonator.kubeconfig \\
    --namespace sealion-concierge --listen 127.0.0.1:8443   # outside a cluster, controllers on
  sealion concierge --kubeconfig admin.kubeconfig --upstream-kubeconfig impersonator.kubeconfig \\
    --listen 127.0.0.1:8443 --tls-cert-file tls.crt --tls-key-file tls.key \\
    --signer-cert-file signer.crt --signer-key-file signer.key --tunnel-listen ''   # fixed certificates, no controllers or agents`,
    )
    .action(async (flags: ConciergeFlags & { clientCaFile: string[]; tunnelHost: string[] }) => {
      // Loaded here, so that other commands (kubectl runs `sealion login` often) start fast.
      const { runConcierge } = await import('../concierge/main.ts');
      const { onSignals } = await import('../lib/lifecycle.ts');
      const running = await runConcierge(
        { ...flags, clientCAFiles: flags.clientCaFile, tunnelHosts: flags.tunnelHost },
        process.env,
      );
      // SIGTERM drains, then exits 0; a second signal, or SIGINT, stops without the drain's waits (concierge/drain.ts).
      onSignals(running, () => process.exit(0));
    });
}
