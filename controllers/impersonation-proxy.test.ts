import { describe, expect, it } from '@jest/globals';
import { X509Certificate } from 'node:crypto';
import { REJECTED_EDIT, type ConciergeStrategy } from '../apis/authentication.ts';
import { MemoryInformer } from '../lib/kube/informer.ts';
import type { ObjectWriter } from '../lib/kube/kube.ts';
import { newLogger } from '../lib/log.ts';
import { detectManaged, type NodeLike } from './detect.ts';
import {
  CA_SECRET,
  decide,
  newImpersonationProxyControllers,
  PROXY_KEY,
  SERVICE_NAME,
  SIGNER_SECRET,
  TLS_SECRET,
  type ProxySettings,
  type SecretLike,
  type ServiceLike,
  type ServingMaterial,
} from './impersonation-proxy.ts';
import type { SyncResult } from '../lib/controller/queue.ts';

/** A signal that never aborts, for syncs called directly. */
const never = new AbortController().signal;

const node = (name: string, labels: Record<string, string> = {}, providerID?: string): NodeLike => ({
  metadata: { name, labels },
  ...(providerID ? { spec: { providerID } } : {}),
});
const controlPlane = node('cp', { 'node-role.kubernetes.io/control-plane': '' });
const worker = node('w1');

describe('managed-cluster detection', () => {
  it.each([
    ['no nodes', [], undefined],
    ['a control-plane node', [controlPlane, worker], false],
    ['a legacy master node', [node('m', { 'node-role.kubernetes.io/master': '' })], false],
    ['only workers', [worker, node('w2')], true],
    ['an EKS node group', [controlPlane, node('e', { 'eks.amazonaws.com/nodegroup': 'ng' })], true],
    ['an AKS provider ID', [controlPlane, node('a', {}, 'azure:///subscriptions/x')], true],
    ['a GKE node pool', [node('g', { 'cloud.google.com/gke-nodepool': 'default' })], true],
  ])('%s → managed %s', (_name, nodes, managed) => {
    const detection = detectManaged(nodes);
    expect(detection?.managed).toBe(managed);
    if (detection) expect(detection.evidence).toMatch(/node/);
  });

  it.each([
    ['disabled', [worker], false, 'NotAvailable', 'Disabled'],
    ['enabled', [controlPlane], true, 'Success', 'Listening'],
    ['auto', [worker], true, 'Success', 'Listening'],
    ['auto', [controlPlane], false, 'NotAvailable', 'DisabledByDefault'],
    ['auto', [], false, 'Error', 'CouldNotGetClusterInfo'],
  ] as const)('mode %s with %j → run %s, %s/%s', (mode, nodes, run, status, reason) => {
    expect(decide(mode, nodes)).toMatchObject({ run, status, reason });
  });

  it('runs on a self-hosted cluster in auto when the direct path does not work there', () => {
    const decision = decide('auto', [controlPlane], 'the cluster did not sign a probe request');
    expect(decision).toMatchObject({ run: true, status: 'Success', reason: 'Listening' });
    expect(decision.message).toContain(
      'the direct path does not work (the cluster did not sign a probe request)',
    );
    // A managed cluster has the proxy anyway; disabled stays disabled.
    expect(decide('disabled', [controlPlane], 'no').run).toBe(false);
  });
});

const NS = 'sealion-concierge';
const settingsOf = (over: Partial<ProxySettings> = {}): ProxySettings => ({
  mode: 'enabled',
  endpoint: '',
  service: { type: 'LoadBalancer', annotations: {}, loadBalancerIP: '', externalTrafficPolicy: 'Local' },
  tls: { certificateAuthorityData: '', secretName: '' },
  ...over,
});

/** An in-memory namespace: writes land in the informers, as the API server's watch would deliver them. */
function world(settings: ProxySettings, nodes: NodeLike[] = [worker]) {
  const services = new MemoryInformer<ServiceLike>();
  const secrets = new MemoryInformer<SecretLike>();
  const writes: string[] = [];
  const writer: ObjectWriter = {
    async apply(obj) {
      writes.push(`apply ${obj.kind} ${obj.metadata.name}`);
      // An apply leaves the status alone, as on the API server.
      if (obj.kind === 'Service') {
        const status = services.get(obj.metadata.name, NS)?.status;
        services.put({ ...(obj as ServiceLike), ...(status ? { status } : {}) });
      } else secrets.put(obj);
    },
    async create(obj) {
      writes.push(`create ${obj.kind} ${obj.metadata.name}`);
      if (secrets.get(obj.metadata.name, NS)) return false;
      secrets.put(obj);
      return true;
    },
    async delete(kind, namespace, name) {
      writes.push(`delete ${kind} ${name}`);
      (kind === 'Service' ? services : secrets).remove(name, namespace);
    },
  };
  const state = {
    settings,
    problem: undefined as string | undefined,
    served: undefined as ServingMaterial | undefined,
    strategy: undefined as ConciergeStrategy | undefined,
    leader: true,
  };
  const { server, writer: leader } = newImpersonationProxyControllers({
    namespace: NS,
    settings: () => ({ settings: state.settings, ...(state.problem ? { problem: state.problem } : {}) }),
    owner: () => ({ apiVersion: 'v1', kind: 'ConfigMap', name: 'sealion-config', uid: 'uid-1' }),
    nodes: new MemoryInformer(nodes as never[]),
    services,
    secrets,
    writes: writer,
    serve: (m) => (state.served = m),
    publish: (s) => (state.strategy = s),
    log: newLogger({ level: 'silent' }),
  });
  // A replica's sync: the leader runs the writer before the server, a follower only the server (the manager runs
  // the writer only on the leader).
  const sync = async (): Promise<SyncResult> => {
    if (state.leader) await leader.sync(PROXY_KEY, never);
    return server.sync(PROXY_KEY, never);
  };
  return { services, secrets, writes, state, sync };
}

const giveAddress = (
  services: MemoryInformer<ServiceLike>,
  ingress: { ip?: string; hostname?: string },
): void => {
  const svc = services.get(SERVICE_NAME, NS)!;
  services.put({ ...svc, status: { loadBalancer: { ingress: [ingress] } } });
};
const certOf = (secrets: MemoryInformer<SecretLike>, name: string): X509Certificate =>
  new X509Certificate(Buffer.from(secrets.get(name, NS)!.data!['tls.crt']!, 'base64'));

describe('the impersonation-proxy controller', () => {
  it('creates a LoadBalancer Service, waits for its address, then issues a matching certificate and reports Success', async () => {
    const w = world(
      settingsOf({
        service: {
          type: 'LoadBalancer',
          annotations: { a: '1' },
          loadBalancerIP: '',
          externalTrafficPolicy: 'Local',
        },
      }),
    );
    expect(await w.sync()).toEqual({ requeueAfterMs: expect.any(Number) });
    expect(w.services.get(SERVICE_NAME, NS)).toMatchObject({
      metadata: { annotations: { a: '1' }, ownerReferences: [{ kind: 'ConfigMap', uid: 'uid-1' }] },
      // Clients' own addresses reach the replicas: audit names them, and the SSH door bounds strangers by them.
      spec: { type: 'LoadBalancer', externalTrafficPolicy: 'Local' },
    });
    expect(w.state.strategy).toMatchObject({ status: 'Error', reason: 'Pending' });
    expect(w.state.served).toBeUndefined();

    giveAddress(w.services, { ip: '10.9.8.7' });
    await w.sync();
    expect(w.state.strategy).toMatchObject({
      type: 'ImpersonationProxy',
      status: 'Success',
      reason: 'Listening',
      impersonationProxyConfig: { endpoint: 'https://10.9.8.7' },
    });
    const caPem = Buffer.from(
      w.state.strategy!.impersonationProxyConfig!.certificateAuthorityData,
      'base64',
    ).toString();
    const serving = certOf(w.secrets, TLS_SECRET);
    expect(serving.checkIP('10.9.8.7')).toBe('10.9.8.7');
    expect(serving.verify(new X509Certificate(caPem).publicKey)).toBe(true);
    expect(w.state.served?.certPem).toContain('BEGIN CERTIFICATE');
    expect(w.state.served?.clientCAPems).toHaveLength(1);
  });

  it('re-issues the serving certificate when the endpoint changes, keeping the CA', async () => {
    const w = world(settingsOf());
    await w.sync();
    giveAddress(w.services, { hostname: 'old.example.com' });
    await w.sync();
    const ca = certOf(w.secrets, CA_SECRET).fingerprint256;
    giveAddress(w.services, { hostname: 'new.example.com' });
    await w.sync();
    expect(certOf(w.secrets, TLS_SECRET).checkHost('new.example.com')).toBe('new.example.com');
    expect(certOf(w.secrets, CA_SECRET).fingerprint256).toBe(ca);
    expect(w.state.strategy?.impersonationProxyConfig?.endpoint).toBe('https://new.example.com');
  });

  it("names the Service's in-cluster DNS name too, which pods on the hub dial, and reissues a certificate without it", async () => {
    const inCluster = `${SERVICE_NAME}.${NS}.svc`;
    const w = world(settingsOf());
    await w.sync();
    giveAddress(w.services, { ip: '10.9.8.7' });
    await w.sync();
    const first = certOf(w.secrets, TLS_SECRET);
    expect(first.checkIP('10.9.8.7')).toBe('10.9.8.7');
    expect(first.checkHost(inCluster)).toBe(inCluster);
    // A certificate from before the name was added (the endpoint's alone) is issued again, with both.
    const { issueCert, loadCA } = await import('../lib/pki/pki.ts');
    const ca = w.secrets.get(CA_SECRET, NS)!.data!;
    const unb64 = (v: string | undefined): string => Buffer.from(v ?? '', 'base64').toString();
    const old = await issueCert(await loadCA(unb64(ca['tls.crt']), unb64(ca['tls.key'])), {
      commonName: 'sealion-impersonation-proxy',
      hosts: ['10.9.8.7'],
      usage: 'server',
      validityMs: 300 * 24 * 3600 * 1000,
    });
    const tls = w.secrets.get(TLS_SECRET, NS)!;
    w.secrets.put({ ...tls, data: { ...tls.data, 'tls.crt': Buffer.from(old.certPem).toString('base64') } });
    await w.sync();
    expect(certOf(w.secrets, TLS_SECRET).checkHost(inCluster)).toBe(inCluster);
    expect(certOf(w.secrets, TLS_SECRET).checkIP('10.9.8.7')).toBe('10.9.8.7');
    // Once it has both, it is kept.
    const kept = certOf(w.secrets, TLS_SECRET).fingerprint256;
    await w.sync();
    expect(certOf(w.secrets, TLS_SECRET).fingerprint256).toBe(kept);
  });

  it('uses the configured endpoint over the load balancer, and no Service for type None', async () => {
    const w = world(
      settingsOf({
        endpoint: 'proxy.example.com:8443',
        service: { type: 'None', annotations: {}, loadBalancerIP: '', externalTrafficPolicy: 'Local' },
      }),
    );
    await w.sync();
    expect(w.services.get(SERVICE_NAME, NS)).toBeUndefined();
    expect(w.state.strategy?.impersonationProxyConfig?.endpoint).toBe('https://proxy.example.com:8443');
    expect(certOf(w.secrets, TLS_SECRET).checkHost('proxy.example.com')).toBe('proxy.example.com');
    // Without a Service, no name inside the cluster leads to the proxy: the certificate claims none.
    expect(certOf(w.secrets, TLS_SECRET).checkHost(`${SERVICE_NAME}.${NS}.svc`)).toBeUndefined();
  });

  it('when disabled, deletes the Service and serving certificate but keeps the CA and stops serving', async () => {
    const w = world(settingsOf({ endpoint: 'proxy.example.com' }));
    await w.sync();
    expect(w.state.served).toBeDefined();
    w.state.settings = settingsOf({ mode: 'disabled' });
    await w.sync();
    expect(w.services.get(SERVICE_NAME, NS)).toBeUndefined();
    expect(w.secrets.get(TLS_SECRET, NS)).toBeUndefined();
    expect(w.secrets.get(CA_SECRET, NS)).toBeDefined();
    expect(w.secrets.get(SIGNER_SECRET, NS)).toBeDefined();
    expect(w.state.served).toBeUndefined();
    expect(w.state.strategy).toMatchObject({ status: 'NotAvailable', reason: 'Disabled' });
  });

  it('reports a rejected config edit, naming the field, beside the fact that the last good settings keep serving', async () => {
    const w = world(settingsOf({ endpoint: 'proxy.example.com' }));
    w.state.problem = 'impersonationProxy.mode: must be one of auto, enabled, disabled';
    await w.sync();
    expect(w.state.served).toBeDefined();
    // It serves: Success, with where; the message says what is wrong with the edit.
    expect(w.state.strategy).toMatchObject({ status: 'Success', reason: 'Listening' });
    expect(w.state.strategy?.impersonationProxyConfig?.endpoint).toBe('https://proxy.example.com');
    expect(w.state.strategy?.message).toContain(REJECTED_EDIT);
    expect(w.state.strategy?.message).toContain('impersonationProxy.mode');
    w.state.problem = undefined;
    await w.sync();
    expect(w.state.strategy).toMatchObject({ status: 'Success', reason: 'Listening' });
  });

  it('writes nothing on a follower, which serves what the leader wrote', async () => {
    const w = world(settingsOf({ endpoint: 'proxy.example.com' }));
    w.state.leader = false;
    await w.sync();
    expect(w.writes).toEqual([]);
    expect(w.state.served).toBeUndefined();
    w.state.leader = true;
    await w.sync();
    const written = w.writes.length;
    w.state.leader = false;
    w.state.served = undefined;
    await w.sync();
    expect(w.writes).toHaveLength(written);
    expect(w.state.served).toBeDefined();
  });

  it('leaves a self-hosted cluster alone in mode auto', async () => {
    const w = world(settingsOf({ mode: 'auto' }), [controlPlane, worker]);
    await w.sync();
    expect(w.services.get(SERVICE_NAME, NS)).toBeUndefined();
    expect(w.state.strategy).toMatchObject({ status: 'NotAvailable', reason: 'DisabledByDefault' });
    expect(w.state.strategy?.message).toContain('node cp is a control-plane node');
  });
});
