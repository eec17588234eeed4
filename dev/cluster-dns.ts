// Cluster DNS for clusters with a node: CoreDNS built from its Go module (static), in an image of its own, run as
// a Deployment behind the kube-dns Service at a fixed address the kubelet gives pods, so that `kubernetes.default`
// and `<service>.<namespace>` resolve in pods as on any cluster.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CACHE_DIR, pinnedVersions } from './build.ts';
import { sharedBuild } from './cache.ts';
import { file, writeImage } from './image.ts';

/** The kube-dns Service's address (in the clusters' service range, 10.0.0.0/24). */
export const CLUSTER_DNS_IP = '10.0.0.10';
export const CLUSTER_DOMAIN = 'cluster.local';
/** CoreDNS listens above 1024, so it needs no capability to bind; the Service maps port 53 to it. */
const DNS_PORT = 1053;

export function corednsImageName(): string {
  return `sealion.dev/coredns:${pinnedVersions().coredns}`;
}

/** The CoreDNS image as an OCI archive, made once from the built binary. */
export async function ensureCoreDNSImage(binary: string): Promise<string> {
  const version = pinnedVersions().coredns;
  const archive = join(CACHE_DIR, '..', 'image', `coredns-${version}.oci.tar`);
  if (existsSync(archive)) return archive;
  await sharedBuild(archive, () =>
    writeImage(
      {
        name: corednsImageName(),
        layers: [{ comment: `CoreDNS ${version}`, entries: [file('/coredns', readFileSync(binary), 0o755)] }],
        config: { User: '65532:65532', Entrypoint: ['/coredns', '-conf', '/etc/coredns/Corefile'] },
      },
      archive,
    ),
  );
  return archive;
}

const COREFILE = `.:${DNS_PORT} {
    errors
    health :8080
    ready :8181
    kubernetes ${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
}
`;

/** What runs CoreDNS: its identity and read rights, its Corefile, the Deployment and the kube-dns Service. */
export function clusterDNSManifests(): object[] {
  const ns = 'kube-system';
  const labels = { 'k8s-app': 'kube-dns' };
  return [
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'coredns', namespace: ns } },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: 'system:coredns' },
      rules: [
        {
          apiGroups: [''],
          resources: ['endpoints', 'services', 'pods', 'namespaces'],
          verbs: ['list', 'watch'],
        },
        { apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], verbs: ['list', 'watch'] },
      ],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRoleBinding',
      metadata: { name: 'system:coredns' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'system:coredns' },
      subjects: [{ kind: 'ServiceAccount', name: 'coredns', namespace: ns }],
    },
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'coredns', namespace: ns },
      data: { Corefile: COREFILE },
    },
    {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name: 'coredns', namespace: ns, labels },
      spec: {
        replicas: 1,
        selector: { matchLabels: labels },
        template: {
          metadata: { labels },
          spec: {
            serviceAccountName: 'coredns',
            dnsPolicy: 'Default',
            securityContext: { runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } },
            containers: [
              {
                name: 'coredns',
                image: corednsImageName(),
                imagePullPolicy: 'Never',
                ports: [
                  { name: 'dns', containerPort: DNS_PORT, protocol: 'UDP' },
                  { name: 'dns-tcp', containerPort: DNS_PORT, protocol: 'TCP' },
                ],
                readinessProbe: { httpGet: { path: '/ready', port: 8181 }, periodSeconds: 2 },
                volumeMounts: [{ name: 'config', mountPath: '/etc/coredns', readOnly: true }],
                securityContext: {
                  allowPrivilegeEscalation: false,
                  readOnlyRootFilesystem: true,
                  capabilities: { drop: ['ALL'] },
                },
              },
            ],
            volumes: [{ name: 'config', configMap: { name: 'coredns' } }],
          },
        },
      },
    },
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'kube-dns', namespace: ns, labels },
      spec: {
        clusterIP: CLUSTER_DNS_IP,
        selector: labels,
        ports: [
          { name: 'dns', port: 53, targetPort: DNS_PORT, protocol: 'UDP' },
          { name: 'dns-tcp', port: 53, targetPort: DNS_PORT, protocol: 'TCP' },
        ],
      },
    },
  ];
}
