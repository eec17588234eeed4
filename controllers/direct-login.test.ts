import { describe, expect, it } from '@jest/globals';
import { X509Certificate } from 'node:crypto';
import { stringify } from 'yaml';
import type { ConciergeStrategy } from '../apis/authentication.ts';
import { apiGroups } from '../apis/groups.ts';
import { MemoryInformer } from '../lib/kube/informer.ts';
import type { ObjectWriter } from '../lib/kube/kube.ts';
import { newLogger } from '../lib/log.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import type { NodeLike } from './detect.ts';
import {
  API_TLS_SECRET,
  APISERVICE_SETTLE_MS,
  clusterInfoFrom,
  decideDirect,
  DIRECT_KEY,
  newDirectLoginControllers,
  PROBE_AGAIN_MS,
  PROBE_RETRY_MS,
  type APIServiceLike,
  type ConfigMapLike,
  type DirectServingMaterial,
} from './direct-login.ts';
import type { SecretLike } from './impersonation-proxy.ts';

const never = new AbortController().signal;
const NS = 'sealion-concierge';
const controlPlane: NodeLike = {
  metadata: { name: 'cp', labels: { 'node-role.kubernetes.io/control-plane': '' } },
};
const gke: NodeLike = { metadata: { name: 'g', labels: { 'cloud.google.com/gke-nodepool': 'pool' } } };
const NAMES = ['v1alpha1.login.concierge.sealion.dev', 'v1alpha1.identity.concierge.sealion.dev'];

const clusterInfo = (server = 'https://api.example.com:6443'): ConfigMapLike => ({
  metadata: { name: 'cluster-info', namespace: 'kube-public' },
  data: {
    kubeconfig: stringify({
      clusters: [{ name: '', cluster: { server, 'certificate-authority-data': 'Q0E=' } }],
    }),
  },
});

async function world(opts: { nodes?: NodeLike[]; mode?: 'auto' | 'enabled' | 'disabled' } = {}) {
  const frontProxyCA = await newCA('front-proxy-ca');
  const secrets = new MemoryInformer<SecretLike>();
  const apiServices = new MemoryInformer<APIServiceLike>();
  const extensionAuth = new MemoryInformer<ConfigMapLike>([
    {
      metadata: { name: 'extension-apiserver-authentication', namespace: 'kube-system' },
      data: {
        'requestheader-client-ca-file': frontProxyCA.certPem,
        'requestheader-allowed-names': '["front-proxy-client"]',
        'requestheader-username-headers': '["X-Remote-User"]',
        'requestheader-group-headers': '["X-Remote-Group"]',
        'requestheader-extra-headers-prefix': '["X-Remote-Extra-"]',
        'requestheader-uid-headers': '["X-Remote-Uid"]',
      },
    },
  ]);
  const writes: string[] = [];
  const writer: ObjectWriter = {
    async apply(obj) {
      writes.push(`apply ${obj.kind} ${obj.metadata.name}`);
      if (obj.kind === 'APIService') {
        const status = apiServices.get(obj.metadata.name)?.status;
        apiServices.put({ ...(obj as APIServiceLike), ...(status ? { status } : {}) });
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
      if (kind === 'APIService') apiServices.remove(name, '');
    },
  };
  const state = {
    mode: opts.mode ?? 'auto',
    info: clusterInfo() as ConfigMapLike | undefined,
    probeFails: undefined as string | undefined,
    probes: 0,
    probeCert: '',
    now: new Date('2026-01-01T00:00:00Z'),
    served: undefined as DirectServingMaterial | undefined,
    strategy: undefined as ConciergeStrategy | undefined,
  };
  const { server, writer: leader } = newDirectLoginControllers({
    namespace: NS,
    groups: apiGroups('sealion.dev'),
    service: { name: 'sealion-concierge-api', port: 443 },
    mode: () => state.mode,
    nodes: new MemoryInformer((opts.nodes ?? [controlPlane]) as never[]),
    secrets,
    configMaps: { extensionAuth, clusterInfo: () => Promise.resolve(state.info) },
    apiServices,
    probe: () => {
      state.probes++;
      return state.probeFails
        ? Promise.reject(new Error(state.probeFails))
        : Promise.resolve(state.probeCert);
    },
    writes: writer,
    owner: () => ({
      apiVersion: 'config.concierge.sealion.dev/v1alpha1',
      kind: 'CredentialIssuer',
      name: 'c',
      uid: 'u1',
    }),
    serve: (m) => (state.served = m),
    publish: (s) => (state.strategy = s),
    log: newLogger({ level: 'silent' }),
    now: () => state.now,
  });
  const available = (): void => {
    for (const name of NAMES) {
      const svc = apiServices.get(name)!;
      apiServices.put({ ...svc, status: { conditions: [{ type: 'Available', status: 'True' }] } });
    }
  };
  return {
    state,
    writes,
    secrets,
    apiServices,
    available,
    frontProxyCA,
    leader,
    server,
    sync: () => leader.sync(DIRECT_KEY, never),
  };
}

describe('the direct path', () => {
  it.each([
    ['disabled', [controlPlane], false],
    ['enabled', [gke], true],
    ['auto', [controlPlane], true],
    ['auto', [gke], false],
    ['auto', [], false],
  ] as const)('mode %s with %j → on %s', (mode, nodes, on) => {
    expect(decideDirect(mode, nodes).on).toBe(on);
  });

  it('reads where users reach the API server from cluster-info, or says what is missing', () => {
    expect(clusterInfoFrom(clusterInfo().data)).toEqual({
      server: 'https://api.example.com:6443',
      certificateAuthorityData: 'Q0E=',
    });
    expect(clusterInfoFrom(undefined)).toMatch(/no kubeconfig/);
    expect(clusterInfoFrom(clusterInfo('http://plain.example.com').data)).toMatch(/no https server/);
    expect(clusterInfoFrom({ kubeconfig: '{{' })).toMatch(/not YAML/);
  });

  it('registers the APIServices once the probe is signed, and says Success with evidence once they are Available', async () => {
    const w = await world();
    expect(await w.sync()).toEqual({ requeueAfterMs: 5_000 });
    // Clients wait while the API server checks the new APIServices; an error only if they stay unavailable.
    expect(w.state.strategy).toMatchObject({ status: 'Error', reason: 'Pending' });
    w.state.now = new Date(w.state.now.getTime() + APISERVICE_SETTLE_MS);
    await w.sync();
    expect(w.state.strategy).toMatchObject({ status: 'Error', reason: 'APIServiceUnavailable' });
    const registered = w.apiServices.get(NAMES[0]!)!;
    expect(registered.spec).toMatchObject({
      service: { namespace: NS, name: 'sealion-concierge-api', port: 443 },
    });
    expect((registered.metadata as { ownerReferences?: unknown[] }).ownerReferences).toEqual([
      expect.objectContaining({ kind: 'CredentialIssuer', uid: 'u1' }),
    ]);
    // The serving certificate names the Service as the API server dials it, signed by the CA in the caBundle.
    const cert = new X509Certificate(
      Buffer.from(w.secrets.get(API_TLS_SECRET, NS)!.data!['tls.crt']!, 'base64'),
    );
    expect(cert.checkHost('sealion-concierge-api.sealion-concierge.svc')).toBeDefined();
    const bundle = new X509Certificate(Buffer.from(registered.spec!.caBundle!, 'base64'));
    expect(cert.verify(bundle.publicKey)).toBe(true);

    w.available();
    expect(await w.sync()).toEqual({ requeueAfterMs: PROBE_AGAIN_MS - APISERVICE_SETTLE_MS });
    expect(w.state.strategy).toMatchObject({
      type: 'TokenCredentialRequestAPI',
      status: 'Success',
      reason: 'ClusterSigns',
      tokenCredentialRequestConfig: {
        endpoint: 'https://api.example.com:6443',
        certificateAuthorityData: 'Q0E=',
      },
    });
    expect(w.state.strategy?.message).toMatch(
      /automatically enabled: node cp is a control-plane node; the cluster signed a probe request/,
    );
    // One probe serves until it is due again.
    expect(w.state.probes).toBe(1);
    w.state.now = new Date(w.state.now.getTime() + PROBE_AGAIN_MS - APISERVICE_SETTLE_MS);
    await w.sync();
    expect(w.state.probes).toBe(2);
  });

  it('hands every replica its serving certificate and the front proxy settings', async () => {
    const w = await world();
    await w.server.sync(DIRECT_KEY, never);
    expect(w.state.served).toBeUndefined();
    await w.sync();
    await w.server.sync(DIRECT_KEY, never);
    expect(w.state.served?.requestHeader).toMatchObject({
      caPem: w.frontProxyCA.certPem,
      allowedNames: ['front-proxy-client'],
      usernameHeaders: ['x-remote-user'],
      uidHeaders: ['x-remote-uid'],
    });
  });

  it('keeps the APIServices away while the cluster does not sign, and tries again within a minute', async () => {
    const w = await world();
    w.state.probeFails = 'not signed within 30 s';
    expect(await w.sync()).toEqual({ requeueAfterMs: PROBE_RETRY_MS });
    expect(w.state.strategy).toMatchObject({ status: 'Error', reason: 'ClusterDoesNotSign' });
    expect(w.state.strategy?.message).toContain('not signed within 30 s');
    expect(w.apiServices.list()).toEqual([]);
  });

  it('keeps the path off where the cluster signs with its front proxy’s CA', async () => {
    const w = await world();
    // The probe's certificate comes from the CA the API server trusts for its front proxy.
    w.state.probeCert = (
      await issueCert(w.frontProxyCA, { commonName: 'sealion-signer-probe', usage: 'client' })
    ).certPem;
    await w.sync();
    expect(w.state.strategy).toMatchObject({ status: 'Error', reason: 'SharedFrontProxyCA' });
    expect(w.apiServices.list()).toEqual([]);
  });

  it('says where it is stuck without cluster-info', async () => {
    const w = await world();
    w.state.info = undefined;
    await w.sync();
    expect(w.state.strategy).toMatchObject({ status: 'Error', reason: 'CouldNotGetClusterInfo' });
    expect(w.state.probes).toBe(0);
  });

  it('takes the APIServices away when disabled, and is off on managed clusters in auto', async () => {
    const w = await world();
    await w.sync();
    expect(w.apiServices.list()).toHaveLength(2);
    w.state.mode = 'disabled';
    await w.sync();
    expect(w.apiServices.list()).toEqual([]);
    expect(w.state.strategy).toMatchObject({ status: 'NotAvailable', reason: 'Disabled' });

    const managed = await world({ nodes: [gke] });
    await managed.sync();
    expect(managed.state.strategy).toMatchObject({ status: 'NotAvailable', reason: 'Disabled' });
    expect(managed.state.strategy?.message).toContain('GKE');
    expect(managed.state.probes).toBe(0);
  });
});
