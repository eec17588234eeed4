// What `sealion port-forward` reaches in the tests and the benchmark: a pod running a small server behind a Service,
// and the objects a user must never reach through it (an ExternalName, a Service whose hand-made endpoint is the API
// server, a pod on its node's network).
import type { Cluster } from './cluster.ts';
import { DEMO_GROUP, DEMO_NAMESPACE } from './installed.ts';

/** The reach pod's and Service's name, and its ports: echo, count and HTTP (the Service's 80). */
export const REACH_WORKLOAD = 'reach-echo';
export const ECHO_PORT = 9000;
export const COUNT_PORT = 9001;
/**
 * Counts a stream whose length its first 8 bytes give (big-endian) and answers the count once it is all in, without
 * waiting for the client's end: for ways in that do not pass a half-close on (kubectl port-forward ends the whole
 * stream when its local client ends its side).
 */
export const SIZED_PORT = 9002;

/**
 * The server every case reaches: an echo port (9000), a port that counts what it got and answers the count once the
 * client ends its side (9001), one that counts a stream of a length given first (9002), and HTTP (8080).
 */
const SERVER = `
const net = require('node:net');
net.createServer({ allowHalfOpen: true }, (s) => s.pipe(s)).listen(9000);
net.createServer({ allowHalfOpen: true }, (s) => {
  let n = 0;
  s.on('data', (c) => (n += c.length));
  s.on('end', () => s.end(String(n)));
}).listen(9001);
net.createServer((s) => {
  let want = -1;
  let n = 0;
  let head = Buffer.alloc(0);
  s.on('data', (c) => {
    if (want < 0) {
      head = Buffer.concat([head, c]);
      if (head.length < 8) return;
      want = Number(head.readBigUInt64BE(0));
      n = head.length - 8;
    } else n += c.length;
    if (n >= want) s.end(String(n));
  });
}).listen(9002);
require('node:http').createServer((q, r) => r.end('hello from ' + process.env.WHERE + '\\n')).listen(8080);
`;

function workload(image: string, where: string, apiserver: string): object[] {
  const labels = { app: 'reach-echo' };
  const node = (name: string, script: string, more: object = {}) => ({
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: DEMO_NAMESPACE, labels: name === 'reach-echo' ? labels : {} },
    spec: {
      containers: [
        {
          name: 'server',
          image,
          imagePullPolicy: 'Never',
          command: ['/usr/local/bin/node', '-e', script],
          env: [{ name: 'WHERE', value: where }],
          ports: [{ name: 'echo', containerPort: 9000 }],
        },
      ],
      ...more,
    },
  });
  const service = (name: string, spec: object) => ({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: DEMO_NAMESPACE },
    spec,
  });
  return [
    node('reach-echo', SERVER),
    // Its address is its node's: never dialed.
    node('on-node', 'setInterval(() => {}, 1 << 30)', { hostNetwork: true }),
    service('reach-echo', {
      selector: labels,
      ports: [
        { name: 'echo', port: 9000, targetPort: 9000 },
        { name: 'count', port: 9001, targetPort: 9001 },
        { name: 'sized', port: 9002, targetPort: 9002 },
        { name: 'http', port: 80, targetPort: 8080 },
      ],
    }),
    // A name for a host outside the cluster.
    service('outside', { type: 'ExternalName', externalName: 'kubernetes.default.svc.cluster.local' }),
    // A Service without a selector whose hand-made endpoint is the API server.
    service('bare', { ports: [{ port: 443 }] }),
    {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {
        name: 'bare-1',
        namespace: DEMO_NAMESPACE,
        labels: { 'kubernetes.io/service-name': 'bare' },
      },
      addressType: 'IPv4',
      ports: [{ name: '', port: 6443 }],
      endpoints: [{ addresses: [apiserver], conditions: { ready: true } }],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: 'reach', namespace: DEMO_NAMESPACE },
      rules: [{ apiGroups: [''], resources: ['services/proxy'], verbs: ['create'] }],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: 'demo-developers-reach', namespace: DEMO_NAMESPACE },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'reach' },
      subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: DEMO_GROUP }],
    },
  ];
}

async function kubectlOk(cluster: Cluster, args: string[], input?: string): Promise<string> {
  const result = await cluster.kubectl(args, input === undefined ? {} : { input });
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  return result.stdout;
}

/**
 * Deploys the reach workload in the demo namespace of `cluster` (its pods from `image`, Sealion's own, which has
 * Node), and lets the demo group reach Services there (create services/proxy).
 */
export async function deployReachWorkload(cluster: Cluster, image: string, where: string): Promise<void> {
  const apiserver = (
    await kubectlOk(cluster, [
      'get',
      'endpointslices',
      '-n',
      'default',
      '-l',
      'kubernetes.io/service-name=kubernetes',
      '-o',
      'jsonpath={.items[0].endpoints[0].addresses[0]}',
    ])
  ).trim();
  await kubectlOk(
    cluster,
    ['apply', '-f', '-'],
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'List',
      items: workload(image, where, apiserver),
    }),
  );
  await kubectlOk(cluster, [
    'wait',
    '-n',
    DEMO_NAMESPACE,
    '--for=condition=Ready',
    '--timeout=120s',
    'pod/reach-echo',
    'pod/on-node',
  ]);
}
