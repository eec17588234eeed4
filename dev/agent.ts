// Prepares a managed cluster for an agent, as the agent manifests would: an identity that may forward as its
// policy allows, ask the cluster's decisions, and keep its credentials Secret, with a kubeconfig for it (out of cluster the agent runs with a client certificate),
// and the real agent process.
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { LocalUpstream } from '../agent/local-proxy.ts';
import { clusterAccess, loadKubeConfig } from '../lib/kube/kube.ts';
import { spkiPin } from '../lib/pki/pki.ts';
import { DEFAULT_POLICY, forwardingRules, type ForwardingPolicy } from '../manifests/forwarding-policy.ts';
import { AGENT_REVIEW_RULES, PROXY_NODE_OPTIONS, REACH_READ_RULES } from '../manifests/install.ts';
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

/**
 * Creates the agent's namespace and RBAC as the agent manifests grant them, for the user `agentUser` (default
 * AGENT_USER): forwarding as `policy` allows (default: the default policy), reviews, and its credentials Secrets.
 * Returns its kubeconfig path. Agents with other policies on one cluster each need a user of their own.
 */
export async function prepareAgentCluster(
  cluster: Cluster,
  namespace: string,
  policy: ForwardingPolicy = DEFAULT_POLICY,
  agentUser: string = AGENT_USER,
): Promise<string> {
  const rules = forwardingRules(policy);
  if (!rules) throw new Error('the development agent takes a built-in policy');
  const user = [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: agentUser }];
  const roleRef = (kind: string, name: string) => ({ apiGroup: 'rbac.authorization.k8s.io', kind, name });
  const rbac = 'rbac.authorization.k8s.io/v1';
  /** A role of `kind` with `rules`, and its binding to the agent's user. */
  const bound = (kind: 'ClusterRole' | 'Role', name: string, rules: object[]): object[] => {
    const scope = kind === 'Role' ? { namespace } : {};
    return [
      { apiVersion: rbac, kind, metadata: { name, ...scope }, rules },
      {
        apiVersion: rbac,
        kind: `${kind}Binding`,
        metadata: { name, ...scope },
        roleRef: roleRef(kind, name),
        subjects: user,
      },
    ];
  };
  const objects = [
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: namespace } },
    ...bound('ClusterRole', `${agentUser}-forwarding`, rules),
    ...bound('ClusterRole', `${agentUser}-reviews`, AGENT_REVIEW_RULES),
    ...bound('ClusterRole', `${agentUser}-reach`, REACH_READ_RULES),
    ...bound('Role', `${agentUser}-credentials`, [
      { apiGroups: [''], resources: ['secrets'], verbs: ['get', 'create', 'update'] },
    ]),
  ];
  const result = await cluster.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }),
  });
  if (result.code !== 0) throw new Error(`applying the agent's RBAC: ${result.stderr}`);
  return cluster.userKubeconfig(agentUser);
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
      // The Node options the install's Deployment gives the agent.
      ...PROXY_NODE_OPTIONS.split(' '),
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
