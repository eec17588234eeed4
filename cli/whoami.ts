// `sealion whoami`: asks the impersonation proxy who it takes the caller to be (WhoAmIRequest), with whatever
// credentials the kubeconfig gives, exec plugins included.
import { Command } from 'commander';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import type { KubernetesUserInfo, WhoAmIRequest } from '../apis/identity.ts';
import { closeHttpsPools, httpsJSON } from '../lib/https-client.ts';

export interface WhoamiFlags {
  kubeconfig: string;
  groupSuffix: string;
  output: 'text' | 'json';
}

export async function whoami(flags: WhoamiFlags): Promise<KubernetesUserInfo> {
  const { loadKubeConfig } = await import('../lib/kube.ts');
  const config = loadKubeConfig(flags.kubeconfig ? { path: flags.kubeconfig } : { default: true });
  const server = config.getCurrentCluster()?.server;
  if (!server) throw new Error('the kubeconfig has no current cluster');
  const group = apiGroups(flags.groupSuffix).identity;
  const url = new URL(
    `apis/${group}/${VERSION}/${Resource.WhoAmIRequest}`,
    server.endsWith('/') ? server : `${server}/`,
  );
  // The CA, and the client certificate or token, running the exec plugin when the kubeconfig names one.
  const tls: { ca?: unknown; cert?: unknown; key?: unknown; headers?: Record<string, string> } = {};
  await config.applyToHTTPSOptions(tls as never);
  const body: WhoAmIRequest = { apiVersion: `${group}/${VERSION}`, kind: 'WhoAmIRequest', spec: {} };
  // client-node hands PEM over as strings or Buffers.
  const pem = (v: unknown): string | undefined =>
    Buffer.isBuffer(v) ? v.toString('utf8') : typeof v === 'string' ? v : undefined;
  const answer = (
    await httpsJSON(url.toString(), {
      method: 'POST',
      body,
      ...(tls.ca ? { caBundlePem: pem(tls.ca)! } : {}),
      ...(tls.cert && tls.key ? { clientCert: { certPem: pem(tls.cert)!, keyPem: pem(tls.key)! } } : {}),
      ...(tls.headers ? { headers: tls.headers } : {}),
    }).catch((err: unknown) => {
      throw new Error(`whoami: ${(err as Error).message}`, { cause: err });
    })
  ).json as WhoAmIRequest;
  if (!answer.status?.kubernetesUserInfo)
    throw new Error('whoami: the answer names no user; is this a Sealion proxy?');
  return answer.status.kubernetesUserInfo;
}

export function whoamiCommand(): Command {
  return new Command('whoami')
    .description('show the user and groups the impersonation proxy sees for your kubeconfig')
    .option('--kubeconfig <path>', 'kubeconfig (default: $KUBECONFIG or ~/.kube/config)', '')
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .option('-o, --output <format>', 'text or json', 'text')
    .addHelpText(
      'after',
      '\nExamples:\n  sealion whoami --kubeconfig me.kubeconfig\n  sealion whoami -o json\n',
    )
    .action(async (flags: WhoamiFlags) => {
      const info = await whoami(flags);
      await closeHttpsPools();
      if (flags.output === 'json') return void process.stdout.write(`${JSON.stringify(info, null, 2)}\n`);
      const lines = [`Username: ${info.user.username}`, `Groups:   ${(info.user.groups ?? []).join(', ')}`];
      for (const [key, values] of Object.entries(info.user.extra ?? {}))
        lines.push(`Extra:    ${key}=${values.join(',')}`);
      process.stdout.write(`${lines.join('\n')}\n`);
    });
}
