// Prepares a managed cluster for an agent, as the agent manifests would: an identity that may impersonate and
// keep its credentials Secret, with a kubeconfig for it (out of cluster the agent runs with a client certificate),
// and the real agent process.
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { LocalUpstream } from '../agent/local-proxy.ts';
import { clusterAccess, loadKubeConfig } from '../lib/kube.ts';
import { spkiPin } from '../lib/pki.ts';
import { REPO_ROOT } from './build.ts';
import type { Cluster } from './cluster.ts';
import { waitForOutput } from './processes.ts';

export const AGENT_USER = 'sealion-agent';

/** Where an in-process agent sends requests, and as whom: the cluster and client certificate of its kubeconfig. */
export function agentUpstream(kubeconfigPath: string): LocalUpstream {
  const access = clusterAccess(loadKubeConfig({ path: kubeconfigPath }));
  return {
    url: access.server,
    ...(access.caPem ? { caPem: access.caPem } : {}),
    ...(access.certPem ? { certPem: access.certPem, keyPem: access.keyPem } : {}),
  };
}

/** Creates the agent's namespace and RBAC; returns the agent's kubeconfig path. */
export async function prepareAgentCluster(cluster: Cluster, namespace: string): Promise<string> {
  for (const args of [
    ['create', 'namespace', namespace],
    [
      'create',
      'clusterrole',
      'sealion-agent-impersonator',
      '--verb=impersonate',
      '--resource=users,groups,serviceaccounts',
    ],
    [
      'create',
      'clusterrolebinding',
      'sealion-agent-impersonator',
      '--clusterrole=sealion-agent-impersonator',
      `--user=${AGENT_USER}`,
    ],
    [
      'create',
      'role',
      'sealion-agent-credentials',
      '-n',
      namespace,
      '--verb=get,create,update',
      '--resource=secrets',
    ],
    [
      'create',
      'rolebinding',
      'sealion-agent-credentials',
      '-n',
      namespace,
      '--role=sealion-agent-credentials',
      `--user=${AGENT_USER}`,
    ],
  ]) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  return cluster.userKubeconfig(AGENT_USER);
}

export interface AgentProcessOptions {
  cluster: string;
  /** The hub's tunnel listener, https://host:port. */
  hub: string;
  tunnelCAPem: string;
  /** The agent's kubeconfig (prepareAgentCluster) and the namespace of its credentials Secret. */
  kubeconfig: string;
  namespace: string;
  bootstrapToken: string;
  transport: 'auto' | 'direct' | 'websocket';
  /** Called with the process as soon as it exists, so that the caller stops it whatever happens next. */
  started: (child: ChildProcessByStdio<null, Readable, Readable>) => void;
}

/**
 * Runs the real `sealion agent` process for a Cluster of the hub, pinning the hub's tunnel CA, with a credentials
 * Secret of its own; resolves with it once its tunnel is up over the transport asked for.
 */
export async function startAgentProcess(
  opts: AgentProcessOptions,
): Promise<ChildProcessByStdio<null, Readable, Readable>> {
  const child = spawn(
    process.execPath,
    [
      join(REPO_ROOT, 'cli/main.ts'),
      'agent',
      ...['--cluster', opts.cluster, '--hub', opts.hub, '--ca-pin', spkiPin(opts.tunnelCAPem)],
      ...['--kubeconfig', opts.kubeconfig, '--namespace', opts.namespace],
      ...['--credentials-secret', `${opts.cluster}-credentials`, '--tunnel-transport', opts.transport],
    ],
    {
      env: { ...process.env, SEALION_BOOTSTRAP_TOKEN: opts.bootstrapToken },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  opts.started(child);
  // The agent logs JSON lines; this one says which transport it dialed.
  const transport = opts.transport === 'auto' ? '[a-z]+' : opts.transport;
  await waitForOutput(child, new RegExp(`"transport":"${transport}"[^\\n]*"tunnel up"`));
  return child;
}
