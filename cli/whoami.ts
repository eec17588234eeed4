// `sealion whoami`: asks the impersonation proxy who it takes the caller to be (WhoAmIRequest), with whatever
// credentials the kubeconfig gives, exec plugins included.
import { request } from 'node:https';
import { Command } from 'commander';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import type { KubernetesUserInfo, WhoAmIRequest } from '../apis/identity.ts';

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
  const options: Parameters<typeof request>[1] = {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
  };
  // Adds the CA, the client certificate or token, running the exec plugin when the kubeconfig names one.
  await config.applyToHTTPSOptions(options);
  const body: WhoAmIRequest = { apiVersion: `${group}/${VERSION}`, kind: 'WhoAmIRequest', spec: {} };
  return new Promise((done, fail) => {
    const req = request(url, options, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (text += chunk));
      res.on('end', () => {
        try {
          const answer = JSON.parse(text) as WhoAmIRequest & { message?: string };
          if (answer.status?.kubernetesUserInfo) return done(answer.status.kubernetesUserInfo);
          fail(new Error(`whoami: HTTP ${res.statusCode}: ${answer.message ?? text.slice(0, 200)}`));
        } catch {
          fail(new Error(`whoami: HTTP ${res.statusCode}: the answer is not JSON; is this a Sealion proxy?`));
        }
      });
    });
    req.on('error', (err) => fail(new Error(`whoami: ${err.message}`, { cause: err })));
    req.end(JSON.stringify(body));
  });
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
      if (flags.output === 'json') return void process.stdout.write(`${JSON.stringify(info, null, 2)}\n`);
      const lines = [`Username: ${info.user.username}`, `Groups:   ${(info.user.groups ?? []).join(', ')}`];
      for (const [key, values] of Object.entries(info.user.extra ?? {}))
        lines.push(`Extra:    ${key}=${values.join(',')}`);
      process.stdout.write(`${lines.join('\n')}\n`);
    });
}
