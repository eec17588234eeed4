// The impersonation-proxy controllers end to end on a real API server: the ConfigMap and the nodes decide
// whether the proxy runs; the local load balancer gives its Service an address; the controllers issue
// certificates and publish where the proxy is onto every authenticator; two replicas share one writer.
import { CONFIG_MAP_NAME } from '../apis/install.ts';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { X509Certificate } from 'node:crypto';
import { connect as tlsConnect } from 'node:tls';
import { REJECTED_EDIT, type ConciergeStrategy } from '../apis/authentication.ts';
import { newKubeClients } from '../lib/kube/kube.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import {
  applyJWTAuthenticator,
  startControlledConcierge,
  type ControlledConcierge,
} from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startLocalLoadBalancer, type LocalLoadBalancer } from '../dev/local-lb.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';

const NS = 'sealion-concierge';
const CONFIG_MAP = CONFIG_MAP_NAME;
const SERVICE = 'sealion-impersonation-proxy';
const GROUP = 'authentication.concierge.sealion.dev';

let cluster: Cluster;
let issuer: TestIssuer;
let lb: LocalLoadBalancer | undefined;
/** The replica the load balancer sends connections to. */
let backendPort = 0;
/** The replicas running, and each one's identity. */
const replicas: ControlledConcierge[] = [];
const identities = new Map<ControlledConcierge, string>();

async function kubectlOk(args: string[], input?: string): Promise<string> {
  const result = await cluster.kubectl(args, input === undefined ? {} : { input });
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  return result.stdout;
}

async function setConfig(yaml: string): Promise<void> {
  await kubectlOk(
    ['apply', '-f', '-'],
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: CONFIG_MAP, namespace: NS },
      data: { 'config.yaml': yaml },
    }),
  );
}

/** Replaces every node with ones that look managed (a GKE node pool) or self-hosted (a control plane). */
async function setNodes(look: 'managed' | 'self-hosted'): Promise<void> {
  await kubectlOk(['delete', 'nodes', '--all', '--wait=false']);
  const labels =
    look === 'managed'
      ? { 'cloud.google.com/gke-nodepool': 'default-pool' }
      : { 'node-role.kubernetes.io/control-plane': '' };
  await kubectlOk(
    ['apply', '-f', '-'],
    JSON.stringify({ apiVersion: 'v1', kind: 'Node', metadata: { name: `${look}-node`, labels } }),
  );
}

async function proxyStrategy(name = 'corp'): Promise<ConciergeStrategy | undefined> {
  const out = await kubectlOk(['get', `jwtauthenticators.${GROUP}`, name, '-o', 'json']);
  const status = (JSON.parse(out) as { status?: { conciergeStrategies?: ConciergeStrategy[] } }).status;
  return status?.conciergeStrategies?.find((s) => s.type === 'ImpersonationProxy');
}

const serviceExists = async (): Promise<boolean> =>
  (await cluster.kubectl(['get', 'service', '-n', NS, SERVICE])).code === 0;

/** Opens TLS to host:port trusting only `caPem`; resolves with the served certificate once verified. */
function handshake(host: string, port: number, caPem: string): Promise<X509Certificate> {
  return new Promise((done, fail) => {
    const socket = tlsConnect({ host, port, ca: caPem, ALPNProtocols: ['http/1.1'] }, () => {
      const cert = socket.getPeerX509Certificate();
      socket.end();
      if (!cert) fail(new Error('no peer certificate'));
      else done(cert);
    });
    socket.on('error', fail);
  });
}

const caOf = (strategy: ConciergeStrategy | undefined): string =>
  Buffer.from(strategy?.impersonationProxyConfig?.certificateAuthorityData ?? '', 'base64').toString();

/** Starts a replica; the first one started is where the load balancer sends connections. */
async function startReplica(identity: string): Promise<ControlledConcierge> {
  const replica = await startControlledConcierge(cluster, {
    namespace: NS,
    configMap: CONFIG_MAP,
    identity,
  });
  replicas.push(replica);
  identities.set(replica, identity);
  if (replicas.length === 1) backendPort = replica.port;
  return replica;
}

async function stopReplica(replica: ControlledConcierge): Promise<void> {
  replicas.splice(replicas.indexOf(replica), 1);
  identities.delete(replica);
  await replica.stop();
}

/** The replica holding the controllers' Lease. */
const leader = (): Promise<string> =>
  kubectlOk([
    'get',
    'lease',
    '-n',
    NS,
    'sealion-concierge-controllers',
    '-o',
    'jsonpath={.spec.holderIdentity}',
  ]);

/** Starts the load balancer unless it runs. */
async function ensureLoadBalancer(): Promise<LocalLoadBalancer> {
  return (lb ??= await startLocalLoadBalancer({
    clients: newKubeClients({ path: cluster.kubeconfigPath }),
    backend: (service) =>
      service.spec?.selector?.['app'] === 'sealion-concierge'
        ? { host: '127.0.0.1', port: backendPort }
        : undefined,
  }));
}

/** Starts the load balancer unless it runs; resolves with the address it gives the proxy's Service once it has one. */
async function balancedAddress(): Promise<string> {
  const running = await ensureLoadBalancer();
  return eventually(() => {
    const address = running.addressOf(NS, SERVICE);
    expect(address).toBeDefined();
    return address!;
  });
}

/**
 * Makes the proxy run on managed-looking nodes, enabled by configuration at 127.0.0.1 and `replica`'s port; resolves
 * with the CA it publishes once it listens there.
 */
async function servingAt(replica: ControlledConcierge): Promise<string> {
  const endpoint = `127.0.0.1:${replica.port}`;
  await setNodes('managed');
  await setConfig(`impersonationProxy: {mode: enabled, endpoint: "${endpoint}"}\n`);
  const strategy = await eventually(async () => {
    const s = await proxyStrategy();
    expect(s).toMatchObject({
      status: 'Success',
      reason: 'Listening',
      impersonationProxyConfig: { endpoint: `https://${endpoint}` },
    });
    return s!;
  }, 30_000);
  return caOf(strategy);
}

beforeAll(async () => {
  cluster = await startCluster({ name: 'controllers', controllerManager: false });
  issuer = await startOIDCIssuer({ audience: 'sealion-controllers' });
  await kubectlOk(['create', 'namespace', NS]);
  await setNodes('managed');
  await setConfig('impersonationProxy: {mode: auto}\n');
  await startReplica('replica-a');
  await applyJWTAuthenticator(cluster, 'corp', issuer, 'sealion-controllers');
});

// Every test starts with one replica, replica-a, holding the Lease; the handover test leaves replica-b instead.
beforeEach(async () => {
  if (replicas.length === 1 && identities.get(replicas[0]!) === 'replica-a') return;
  for (const replica of [...replicas]) await stopReplica(replica);
  await startReplica('replica-a');
  await eventually(async () => expect(await leader()).toBe('replica-a'), 30_000);
});

afterAll(async () => {
  await Promise.all(replicas.map((r) => r.stop()));
  await lb?.stop();
  await issuer?.stop();
  await cluster?.stop();
});

describe('the impersonation proxy, driven by its controllers', () => {
  it('stays Pending until the load balancer has an address, then publishes an endpoint that verifies', async () => {
    // Pending is the state of a Service that no load balancer has given an address: none runs, and the Service is
    // made anew.
    await lb?.stop();
    lb = undefined;
    await kubectlOk(['delete', 'service', '-n', NS, SERVICE, '--ignore-not-found']);
    await setNodes('managed');
    await setConfig('impersonationProxy: {mode: auto}\n');
    await eventually(async () => {
      expect(await serviceExists()).toBe(true);
      expect(await proxyStrategy()).toMatchObject({ status: 'Error', reason: 'Pending' });
    }, 30_000);

    const ip = await balancedAddress();
    const strategy = await eventually(async () => {
      const s = await proxyStrategy();
      expect(s).toMatchObject({
        status: 'Success',
        reason: 'Listening',
        impersonationProxyConfig: { endpoint: `https://${ip}` },
      });
      expect(s?.message).toContain('automatically enabled');
      return s!;
    }, 30_000);
    // Through the load balancer, trusting only the published CA: the certificate names the address.
    const served = await handshake(ip, 443, caOf(strategy));
    expect(served.checkIP(ip)).toBe(ip);

    const table = await kubectlOk(['get', `jwtauthenticators.${GROUP}`]);
    expect(table).toMatch(/PROXY ENDPOINT/);
    expect(table).toContain(`https://${ip}`);
    const issuerStatus = await kubectlOk([
      'get',
      'credentialissuers.config.concierge.sealion.dev',
      CONFIG_MAP,
      '-o',
      'jsonpath={.status.strategies[?(@.type=="ImpersonationProxy")].frontend.impersonationProxyInfo.endpoint}',
    ]);
    expect(issuerStatus).toBe(`https://${ip}`);
  });

  it.each([
    ['managed', 'auto', true, 'Success', 'Listening', /automatically enabled: .*gke/i],
    ['managed', 'enabled', true, 'Success', 'Listening', /enabled by configuration/],
    ['managed', 'disabled', false, 'NotAvailable', 'Disabled', /disabled by configuration/],
    ['self-hosted', 'auto', false, 'NotAvailable', 'DisabledByDefault', /automatically disabled: .*control/i],
    ['self-hosted', 'enabled', true, 'Success', 'Listening', /enabled by configuration/],
    ['self-hosted', 'disabled', false, 'NotAvailable', 'Disabled', /disabled by configuration/],
  ] as const)(
    'on a %s-looking cluster with mode %s: Service %s, strategy %s/%s',
    async (look, mode, service, status, reason, message) => {
      // Where the proxy runs, its endpoint is the load balancer's address.
      await ensureLoadBalancer();
      await setNodes(look);
      await setConfig(`impersonationProxy: {mode: ${mode}}\n`);
      await eventually(async () => {
        expect(await serviceExists()).toBe(service);
        const strategy = await proxyStrategy();
        expect(strategy).toMatchObject({ status, reason });
        expect(strategy?.message).toMatch(message);
        expect(Boolean(strategy?.impersonationProxyConfig)).toBe(status === 'Success');
      }, 30_000);
      // Disabling keeps the CA, so kubeconfigs that trust it work again once the proxy is back.
      await kubectlOk(['get', 'secret', '-n', NS, 'sealion-impersonation-proxy-ca']);
    },
  );

  it('issues a new serving certificate when the endpoint changes, and keeps the CA across a restart', async () => {
    const [first] = replicas;
    // Published first at the load balancer's address.
    await setNodes('managed');
    await setConfig('impersonationProxy: {mode: auto}\n');
    const balancedIP = await balancedAddress();
    await eventually(async () => {
      expect((await proxyStrategy())?.impersonationProxyConfig?.endpoint).toBe(`https://${balancedIP}`);
    }, 30_000);
    const endpoint = `127.0.0.1:${first!.port}`;
    await setConfig(`impersonationProxy: {mode: enabled, endpoint: "${endpoint}"}\n`);
    const strategy = await eventually(async () => {
      const s = await proxyStrategy();
      expect(s?.impersonationProxyConfig?.endpoint).toBe(`https://${endpoint}`);
      return s!;
    }, 30_000);
    const ca = caOf(strategy);
    const served = await eventually(async () => {
      const cert = await handshake('127.0.0.1', first!.port, ca);
      expect(cert.checkIP('127.0.0.1')).toBe('127.0.0.1');
      return cert;
    });
    expect(served.checkIP(balancedIP)).toBeUndefined();

    await stopReplica(first!);
    const restarted = await startReplica('replica-a');
    await setConfig(`impersonationProxy: {mode: enabled, endpoint: "127.0.0.1:${restarted.port}"}\n`);
    // The restarted replica serves a certificate from the same CA the kubeconfigs already trust.
    await eventually(() => handshake('127.0.0.1', restarted.port, ca), 30_000);
    expect(caOf(await proxyStrategy())).toBe(ca);
  });

  it('keeps the last good configuration serving through a broken edit, says both, and clears the note once fixed', async () => {
    const [replica] = replicas;
    const endpoint = `127.0.0.1:${replica!.port}`;
    const ca = await servingAt(replica!);
    await setConfig(`impersonationProxy: {mode: sometimes, endpoint: "${endpoint}"}\n`);
    await eventually(async () => {
      const strategy = await proxyStrategy();
      // Still published, and still serving: the last good configuration is in effect, and the status says so; its
      // message says what is wrong with the edit.
      expect(strategy).toMatchObject({ status: 'Success', reason: 'Listening' });
      expect(strategy?.message).toContain(REJECTED_EDIT);
      expect(strategy?.message).toContain('impersonationProxy.mode: must be one of auto, enabled, disabled');
      expect(strategy?.impersonationProxyConfig?.endpoint).toBe(`https://${endpoint}`);
    }, 30_000);
    await handshake('127.0.0.1', replica!.port, ca);

    await setConfig(`impersonationProxy: {mode: enabled, endpoint: "${endpoint}"}\n`);
    await eventually(async () => {
      const strategy = await proxyStrategy();
      expect(strategy).toMatchObject({ status: 'Success', reason: 'Listening' });
      expect(strategy?.message).not.toContain(REJECTED_EDIT);
    }, 30_000);
  });

  it('keeps the last good configuration and its Service through a restart during a broken edit', async () => {
    const [replica] = replicas;
    const ca = await servingAt(replica!);
    // Under the defaults (mode auto) the proxy would not run on these nodes, and its Service would go.
    await setNodes('self-hosted');
    await setConfig('impersonationProxy: {mode: sometimes}\n');
    await eventually(async () => expect((await proxyStrategy())?.message).toContain(REJECTED_EDIT), 30_000);
    await stopReplica(replica!);
    const restarted = await startReplica('replica-a');
    // The restarted replica serves the last good configuration's certificate: it runs the proxy.
    await eventually(() => handshake('127.0.0.1', restarted.port, ca), 30_000);
    expect(await serviceExists()).toBe(true);
    const strategy = await proxyStrategy();
    expect(strategy?.message).toContain('impersonationProxy.mode: must be one of auto, enabled, disabled');

    await setNodes('managed');
    await setConfig(`impersonationProxy: {mode: enabled, endpoint: "127.0.0.1:${restarted.port}"}\n`);
    await eventually(async () => {
      expect(await proxyStrategy()).toMatchObject({ status: 'Success', reason: 'Listening' });
    }, 30_000);
  });

  it('lets one of two replicas write, and hands over to the other when it stops', async () => {
    const [first] = replicas;
    await servingAt(first!);
    const second = await startReplica('replica-b');
    const version = async (): Promise<string> =>
      kubectlOk(['get', `jwtauthenticators.${GROUP}`, 'corp', '-o', 'jsonpath={.metadata.resourceVersion}']);
    expect(await leader()).toBe('replica-a');
    // Both replicas see the same world; the follower writes nothing, so the status does not flap. A quiet
    // spell is the only way to observe that nothing happens.
    const before = await version();
    await new Promise((r) => setTimeout(r, 3_000));
    expect(await version()).toBe(before);

    await stopReplica(first!);
    await eventually(async () => expect(await leader()).toBe('replica-b'), 20_000);
    // The new leader publishes, including onto authenticators created after the handover.
    await applyJWTAuthenticator(cluster, 'late', issuer, 'sealion-controllers');
    await eventually(async () => {
      expect(await proxyStrategy('late')).toMatchObject({ status: 'Success', reason: 'Listening' });
    }, 20_000);
    expect(replicas).toEqual([second]);
  });
});
