// `sealion dev up` (`npm start`): a real local cluster with the concierge in front of it, a local OIDC issuer,
// a demo user with RBAC, and kubeconfigs under .sealion/. Runs until Ctrl-C, then removes everything it started.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from '../integration/harness/build.ts';
import { startCluster, type Cluster } from '../integration/harness/cluster.ts';
import {
  applyJWTAuthenticator,
  startLocalConcierge,
  type LocalConcierge,
} from '../integration/harness/concierge.ts';
import { eventually } from '../integration/harness/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../integration/harness/oidc-issuer.ts';

const DEMO_USER = 'demo@sealion.dev';
const DEMO_GROUP = 'demo-developers';
const DEMO_NAMESPACE = 'demo';
/** The demo token lives as long as a working day; `sealion login` (exec plugin) will replace it. */
const DEMO_TOKEN_SECONDS = 12 * 3600;

export async function devUp(): Promise<void> {
  const log = (line: string): void => console.error(`[dev] ${line}`);
  const started = Date.now();
  // Filled in as they start, so that Ctrl-C at any moment stops what exists.
  const running: { cluster?: Cluster; issuer?: TestIssuer; proxy?: LocalConcierge } = {};
  let stopping = false;
  const shutdown = (): void => {
    if (stopping) return;
    stopping = true;
    log('stopping');
    (async () => {
      await running.proxy?.stop();
      await running.issuer?.stop();
      await running.cluster?.stop();
    })().then(
      () => process.exit(0),
      (err: unknown) => {
        console.error(err);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);

  const cluster = (running.cluster = await startCluster({ name: 'sealion-dev', log }));
  log('starting the concierge and a local OIDC issuer');
  const issuer = (running.issuer = await startOIDCIssuer({ audience: 'sealion-dev' }));
  const proxy = (running.proxy = await startLocalConcierge(cluster));
  await applyJWTAuthenticator(cluster, 'demo', issuer, 'sealion-dev');
  for (const args of [
    ['create', 'namespace', DEMO_NAMESPACE],
    [
      'create',
      'rolebinding',
      'demo-developers-edit',
      '-n',
      DEMO_NAMESPACE,
      '--clusterrole=edit',
      `--group=${DEMO_GROUP}`,
    ],
    ['create', 'clusterrole', 'namespace-reader', '--verb=get,list,watch', '--resource=namespaces'],
    [
      'create',
      'clusterrolebinding',
      'demo-developers-namespaces',
      '--clusterrole=namespace-reader',
      `--group=${DEMO_GROUP}`,
    ],
  ]) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  await eventually(async () => {
    const ready = await cluster.kubectl([
      'get',
      'jwtauthenticator.authentication.concierge.sealion.dev',
      'demo',
      '-o',
      'jsonpath={.status.phase}',
    ]);
    if (ready.stdout !== 'Ready') throw new Error(`JWTAuthenticator demo is ${ready.stdout || 'not ready'}`);
    // The aggregated edit role gets its rules from kube-controller-manager shortly after start.
    const allowed = await cluster.kubectl([
      'auth',
      'can-i',
      'create',
      'configmaps',
      '-n',
      DEMO_NAMESPACE,
      `--as=${DEMO_USER}`,
      `--as-group=${DEMO_GROUP}`,
    ]);
    if (allowed.stdout.trim() !== 'yes') throw new Error('demo RBAC not in effect yet');
  }, 60_000);

  const dir = join(REPO_ROOT, '.sealion');
  mkdirSync(dir, { recursive: true });
  const token = await issuer.mint(
    { username: DEMO_USER, groups: [DEMO_GROUP] },
    { expiresIn: DEMO_TOKEN_SECONDS },
  );
  const demoConfig = join(dir, 'demo.kubeconfig');
  writeFileSync(demoConfig, proxy.kubeconfig({ token }), { mode: 0o600 });
  const rel = '.sealion/demo.kubeconfig';
  console.log(`
Sealion is up in ${((Date.now() - started) / 1000).toFixed(1)}s.
  API server:           ${cluster.url}
  impersonation proxy:  ${proxy.url}
  demo user:            ${DEMO_USER} (group ${DEMO_GROUP}), an OIDC token from the local issuer

Try it, as the demo user through the proxy:
  kubectl --kubeconfig ${rel} get namespaces                    # allowed
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} create configmap hello --from-literal=a=b   # allowed
  kubectl --kubeconfig ${rel} create namespace not-allowed      # Forbidden, from the cluster's RBAC
  kubectl --kubeconfig ${rel} auth whoami
Admin access: kubectl --kubeconfig ${cluster.kubeconfigPath} get jwtauthenticators

Not built yet: the sealion login exec plugin and the agent-backed second cluster.
Press Ctrl-C to stop; everything started here is removed.`);
}
