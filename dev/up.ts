// `npm start`: Sealion installed from its manifests as pods on two real local clusters (dev/installed.ts), a demo
// user, and kubeconfigs under .sealion/. Runs until Ctrl-C, then removes everything it started. `--install helm`
// installs with the README's Helm block instead of its kustomize block.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { parse } from 'yaml';
import { accessReviewerRole } from '../apis/install.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { REPO_ROOT } from './build.ts';
import {
  enableSsh,
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_POD,
  DEMO_USER,
  EDGE,
  INSTALL_WITH,
  startInstalledSealion,
  type InstallWith,
  stopInstalled,
  type Running,
  workloadsSection,
  WORKLOAD_ACCOUNT,
  WORKLOAD_NAMESPACE,
  WORKLOAD_PREFIX,
} from './installed.ts';
import type { Cluster } from './cluster.ts';
import { ensureKubectlImage } from './image.ts';
import { stopOnSignal } from './processes.ts';
import { deployReachWorkload, REACH_WORKLOAD } from './reach-workload.ts';
import { SHIM_DIR, shimLines, writeShim } from './shim.ts';

/** The demo token lives as long as a working day; the exec plugin trades it for short-lived certificates. */
const DEMO_TOKEN_SECONDS = 12 * 3600;

async function devUp(): Promise<void> {
  const { values } = parseArgs({ options: { install: { type: 'string', default: 'kustomize' } } });
  if (!(INSTALL_WITH as readonly string[]).includes(values.install))
    throw new Error(`--install ${values.install}: use ${INSTALL_WITH.join(' or ')}`);
  const using = values.install as InstallWith;
  const log = (line: string): void => console.error(`[dev] ${line}`);
  // Filled in as they start, so that Ctrl-C at any moment, or a failure, stops what exists.
  const running: Running = {};
  const stopAll = (): Promise<void> => stopInstalled(running);
  const signals = stopOnSignal(stopAll, log);

  try {
    await start(running, log, using);
  } catch (err) {
    // Interrupted during start-up: the signal's stop stops everything and exits. Otherwise nothing half-started
    // may keep running, nor keep this process alive after the error is printed.
    if (!signals.claim()) return;
    log('start-up failed; stopping what was started');
    await stopAll().catch((stopErr: unknown) => console.error(stopErr));
    throw err;
  }
}

async function start(running: Running, log: (line: string) => void, using: InstallWith): Promise<void> {
  const started = Date.now();
  // kubectl's image on the hub's node: the README's Deployment of a controller on the hub runs it.
  const installed = await startInstalledSealion(running, log, {
    using,
    hubImages: [await ensureKubectlImage(log)],
  });
  const { hub: cluster, edge, issuer, image, kubeconfig: kubeconfigFor } = installed;
  // A Service on each cluster to reach with sealion port-forward.
  await Promise.all([
    deployReachWorkload(cluster, image.name, 'hub'),
    deployReachWorkload(edge, image.name, EDGE),
  ]);
  const dir = join(REPO_ROOT, '.sealion');
  mkdirSync(dir, { recursive: true });
  const token = await issuer.mint(
    { username: DEMO_USER, groups: [DEMO_GROUP] },
    { expiresIn: DEMO_TOKEN_SECONDS },
  );
  const kubeconfig = await kubeconfigFor(token);
  writeFileSync(join(dir, 'demo.kubeconfig'), kubeconfig, { mode: 0o600 });
  writeFileSync(join(dir, `${EDGE}.kubeconfig`), await kubeconfigFor(token, EDGE), { mode: 0o600 });
  writeFileSync(join(dir, 'direct.kubeconfig'), await kubeconfigFor(token, '', false, 'direct'), {
    mode: 0o600,
  });
  await letWorkloadsIn(cluster, edge);
  // A reviewer for access requests, with a kubeconfig of their own, and edge's policy for them.
  await letOncallAsk(cluster, edge);
  const reviewerToken = await issuer.mint(
    { username: REVIEWER_USER, groups: [] },
    { expiresIn: DEMO_TOKEN_SECONDS },
  );
  writeFileSync(join(dir, 'reviewer.kubeconfig'), await kubeconfigFor(reviewerToken), { mode: 0o600 });
  writeFileSync(join(dir, 'deployer.yaml'), workloadsSection().deployment);
  // The SSH door, signing in by the device login at the local issuer. Its address and host key are what any signed-in
  // user reads with `sealion ssh config`, printed below into .sealion/ (a person's own go to ~/.ssh).
  await enableSsh(cluster, { login: { authenticator: 'my-oidc' } });
  const sshConfig = '-F .sealion/ssh_config';
  const edgeRel = `.sealion/${EDGE}.kubeconfig`;
  const endpoint = (parse(kubeconfig) as { clusters: { cluster: { server: string } }[] }).clusters[0]!.cluster
    .server;
  const rel = '.sealion/demo.kubeconfig';
  const admin = `kubectl --kubeconfig ${cluster.kubeconfigPath}`;
  const mapped = `${WORKLOAD_PREFIX}system:serviceaccounts:${WORKLOAD_NAMESPACE}`;
  const controllerKubeconfig = `.sealion/${WORKLOAD_ACCOUNT}-${EDGE}.kubeconfig`;
  // The CLI as a command of its own: npx would cost seconds a command and print npm's notices.
  writeShim();
  console.log(`
Sealion is up in ${((Date.now() - started) / 1000).toFixed(1)}s.
  API server:           ${cluster.url}
  impersonation proxy:  ${endpoint} (a LoadBalancer Service on the local load balancer)
  Sealion's pods:       installed from config/concierge (hub) and config/agent (${EDGE}), image ${image.name}
  demo user:            ${DEMO_USER} (group ${DEMO_GROUP}), an OIDC token from the local issuer, which the
                        kubeconfig's exec plugin (sealion login static) trades for client certificates

The sealion CLI of this checkout, fast and quiet (${SHIM_DIR}/sealion runs it on node_modules' Node, without npm;
npx sealion works too, seconds slower), with completion, for the commands below:
${shimLines(SHIM_DIR)
  .map((line) => `  ${line}`)
  .join('\n')}

Try it, as the demo user through the proxy:
  kubectl --kubeconfig ${rel} get namespaces                    # allowed
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} create configmap hello --from-literal=a=b   # allowed
  kubectl --kubeconfig ${rel} create namespace not-allowed      # Forbidden, from the cluster's RBAC
  kubectl --kubeconfig ${rel} auth whoami
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} exec -it ${DEMO_POD} -- sh       # a shell in a pod, through the proxy
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} logs -f ${DEMO_POD}
Or straight to the hub's API server, the direct path (the hub's concierge serves TokenCredentialRequest through the
API server's own aggregated API, and the cluster signs the certificates; mode auto picks it on self-hosted clusters):
  kubectl --kubeconfig .sealion/direct.kubeconfig get namespaces                 # allowed, answered by the API server itself
  kubectl --kubeconfig .sealion/direct.kubeconfig create namespace not-allowed   # Forbidden, from the cluster's RBAC
  kubectl --kubeconfig ${cluster.kubeconfigPath} get credentialissuers -o yaml        # both ways in, with their evidence
And on ${EDGE}, a second cluster the concierge never dials: its agent dialed out, and ${EDGE}'s RBAC decides:
  kubectl --kubeconfig ${edgeRel} get namespaces                    # allowed
  kubectl --kubeconfig ${edgeRel} -n ${DEMO_NAMESPACE} create configmap hello --from-literal=a=b   # Forbidden, from ${EDGE}'s RBAC
  kubectl --kubeconfig ${edgeRel} -n ${DEMO_NAMESPACE} --as=system:serviceaccount:${DEMO_NAMESPACE}:default get pods   # Forbidden: ${EDGE} decides who may impersonate there, not the hub
A controller on the hub reaches ${EDGE} through its agent as its own service account, ${WORKLOAD_NAMESPACE}/${WORKLOAD_ACCOUNT} here, with a
projected token for Sealion's audience (the README's Deployment, which runs kubectl). ${EDGE}'s Cluster takes the
hub's workloads under ${WORKLOAD_PREFIX}, and ${EDGE}'s RBAC lets ${mapped} read ${DEMO_NAMESPACE}:
  sealion cluster kubeconfig ${EDGE} --kubeconfig ${cluster.kubeconfigPath} --service-account ${WORKLOAD_NAMESPACE}/${WORKLOAD_ACCOUNT} > ${controllerKubeconfig}
  ${admin} -n ${WORKLOAD_NAMESPACE} create configmap ${EDGE}-kubeconfig --from-file=kubeconfig=${controllerKubeconfig}
  ${admin} apply --filename=.sealion/deployer.yaml
  ${admin} -n ${WORKLOAD_NAMESPACE} rollout status deployment/${WORKLOAD_ACCOUNT} --timeout=120s
  ${admin} -n ${WORKLOAD_NAMESPACE} exec deployment/${WORKLOAD_ACCOUNT} -- kubectl -n ${DEMO_NAMESPACE} get pods               # allowed, by ${EDGE}'s RBAC
  ${admin} -n ${WORKLOAD_NAMESPACE} exec deployment/${WORKLOAD_ACCOUNT} -- kubectl -n ${DEMO_NAMESPACE} delete pod ${DEMO_POD}   # Forbidden, from ${EDGE}'s RBAC
A Service inside each cluster, from this machine (each prints its local port: curl it; that cluster's RBAC decides,
and the hub's concierge or ${EDGE}'s agent dials the Service's pod):
  sealion port-forward --kubeconfig ${rel} -n ${DEMO_NAMESPACE} svc/${REACH_WORKLOAD} :http
  sealion port-forward --kubeconfig ${edgeRel} -n ${DEMO_NAMESPACE} svc/${REACH_WORKLOAD} :http
Admin access (the PROXY ENDPOINT column is where the proxy is published; clusters shows each agent and its policy):
  kubectl --kubeconfig ${cluster.kubeconfigPath} get pods -A -o wide
  kubectl --kubeconfig ${cluster.kubeconfigPath} get jwtauthenticators
  kubectl --kubeconfig ${cluster.kubeconfigPath} get clusters -o wide
  kubectl --kubeconfig ${edge.kubeconfigPath} get pods -A -o wide
An OIDC login instead of the fixed demo token, one kubeconfig with a context for each cluster (open the URL the
login prints, where the local OIDC provider signs the demo user in; --oidc-device prints a code instead):
  sealion get kubeconfig --kubeconfig ${cluster.kubeconfigPath} --all-clusters --output-file .sealion/oidc.kubeconfig
  sealion clusters --kubeconfig .sealion/oidc.kubeconfig        # logs in, then asks each cluster who you are
  sealion get pods --all-clusters -n ${DEMO_NAMESPACE} --kubeconfig .sealion/oidc.kubeconfig     # every cluster's pods, a CLUSTER column first
  sealion auth can-i list,create configmaps --all-clusters -n ${DEMO_NAMESPACE} --kubeconfig .sealion/oidc.kubeconfig   # each cluster answers: yes on hub, no on ${EDGE}
  kubectl --kubeconfig .sealion/oidc.kubeconfig --context ${new URL(endpoint).host}/${EDGE} get namespaces
SSH into pods of any cluster with plain ssh, set up as any signed-in user sets it up (here into .sealion/; yours:
>> ~/.ssh/config and ~/.ssh/known_hosts). The first ssh prints a code: open the link it gives, where the local OIDC
provider signs the demo user in; ssh then says until when your SSH key is bound, and needs no login till then:
  sealion ssh config --kubeconfig ${rel} --known-hosts > .sealion/known_hosts
  sealion ssh config --kubeconfig ${rel} --known-hosts-file ${join(dir, 'known_hosts')} > .sealion/ssh_config
  ssh ${sshConfig} -t sealion ${EDGE}/${DEMO_NAMESPACE}/${DEMO_POD}                   # a shell in ${EDGE}'s pod, through its agent
  ssh ${sshConfig} sealion hub/${DEMO_NAMESPACE}/${DEMO_POD} -- uname -a           # a command (scripts: -o BatchMode=yes)
  ssh ${sshConfig} -t sealion                                    # a menu of what you may exec into
  sftp ${sshConfig} sealion                                      # files: /<cluster>/<namespace>/<pod>/<container>/…
  ssh ${sshConfig} -N -L 8080:${EDGE}/${DEMO_NAMESPACE}/svc/${REACH_WORKLOAD}:80 sealion   # then: curl localhost:8080
Every request above is audited (audit.k8s.io/v1 events in the concierge pods' logs, joined to each API server's
own by audit ID), and every exec -it recorded; the demo user may read the recordings of every replica:
  sealion recordings list --kubeconfig .sealion/oidc.kubeconfig   # then: sealion recordings play <ID> --kubeconfig …

Access on request (the README's section): on ${EDGE}, anyone may ask for the group ${ONCALL_GROUP} for an hour at most, which ${EDGE}'s RBAC
lets edit ${DEMO_NAMESPACE}; ${REVIEWER_USER} reviews (.sealion/reviewer.kubeconfig). The demo user asks and waits; the reviewer, in
another terminal, approves; then the demo user's next request to ${EDGE} carries the group, until the grant ends:
  sealion request create --kubeconfig ${rel} --cluster ${EDGE} --group ${ONCALL_GROUP} --duration 1h --reason INC-4711 --name ${DEMO_REQUEST} --wait
  sealion request approve ${DEMO_REQUEST} --kubeconfig .sealion/reviewer.kubeconfig --reason on-call
  kubectl --kubeconfig ${edgeRel} -n ${DEMO_NAMESPACE} create configmap ${ONCALL_GROUP} --from-literal=a=b   # allowed now, by ${EDGE}'s RBAC for ${ONCALL_GROUP}

Press Ctrl-C to stop; everything started here is removed.`);
}

/** Who reviews access requests in the demo, the group edge lets the demo user ask for, and the printed request's name. */
const REVIEWER_USER = 'reviewer@sealion.dev';
const ONCALL_GROUP = 'oncall';
const DEMO_REQUEST = 'try-oncall';

/**
 * What the README's section on access requests does: edge's Cluster lets anyone ask for group oncall for an hour at
 * most, the reviewer holds the install's reviewer role on the hub, and edge's RBAC lets oncall edit the demo namespace.
 */
async function letOncallAsk(hub: Cluster, edge: Cluster): Promise<void> {
  const access = JSON.stringify({ spec: { access: { groups: [ONCALL_GROUP], maxDurationSeconds: 3600 } } });
  const steps: [Cluster, string[]][] = [
    [hub, ['patch', 'cluster', EDGE, '--type', 'merge', '-p', access]],
    [
      hub,
      [
        'create',
        'clusterrolebinding',
        'access-reviewers',
        `--clusterrole=${accessReviewerRole(DEFAULT_INSTALL.namespace)}`,
        `--user=${REVIEWER_USER}`,
      ],
    ],
    [
      edge,
      [
        '-n',
        DEMO_NAMESPACE,
        'create',
        'rolebinding',
        'oncall-edit',
        '--clusterrole=edit',
        `--group=${ONCALL_GROUP}`,
      ],
    ],
  ];
  for (const [cluster, args] of steps) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr.trim()}`);
  }
}

/**
 * What the README's section on controllers does before the kubeconfig: edge's Cluster takes the hub's workloads, edge
 * lets the hub's service accounts of one namespace read the demo namespace, and the hub has that service account.
 */
async function letWorkloadsIn(hub: Cluster, edge: Cluster): Promise<void> {
  const patch = JSON.stringify({ spec: { workloads: { usernamePrefix: WORKLOAD_PREFIX } } });
  const steps: [Cluster, string[]][] = [
    [hub, ['patch', 'cluster', EDGE, '--type', 'merge', '-p', patch]],
    [
      edge,
      [
        '-n',
        DEMO_NAMESPACE,
        'create',
        'rolebinding',
        `hub-${WORKLOAD_NAMESPACE}-view`,
        '--clusterrole=view',
        `--group=${WORKLOAD_PREFIX}system:serviceaccounts:${WORKLOAD_NAMESPACE}`,
      ],
    ],
    [hub, ['create', 'namespace', WORKLOAD_NAMESPACE]],
    [hub, ['-n', WORKLOAD_NAMESPACE, 'create', 'serviceaccount', WORKLOAD_ACCOUNT]],
  ];
  for (const [cluster, args] of steps) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr.trim()}`);
  }
}

try {
  await devUp();
} catch (err) {
  // Expected failures (a port taken, a build that failed) print one line, not a stack trace.
  console.error(`npm start: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
