// `sealion manifests`: the install manifests for any group suffix, namespace and image.
import { Command, InvalidArgumentError, Option } from 'commander';
import { isValidGroupSuffix } from '../apis/groups.ts';
import { parsePolicy, POLICY_NAMES } from '../manifests/forwarding-policy.ts';
import { DEFAULT_INSTALL, type InstallOptions } from '../manifests/install.ts';
import { componentObjects, toYaml, writeKustomize, type Component } from '../manifests/render.ts';
import { isDNSLabel } from '../apis/names.ts';

const COMPONENTS: readonly Component[] = ['crds', 'concierge', 'agent'];

function namespaceName(value: string): string {
  if (!isDNSLabel(value)) throw new InvalidArgumentError(`${JSON.stringify(value)} is not a namespace name`);
  return value;
}

export function manifestsCommand(): Command {
  return new Command('manifests')
    .description('print the install manifests (or write kustomize folders) for a group suffix and namespace')
    .argument('[components...]', `which parts: ${COMPONENTS.join(', ')}`, ['crds', 'concierge'])
    .addOption(
      new Option('--group-suffix <suffix>', "API group suffix (pinniped.dev gives Pinniped's groups)")
        .default(DEFAULT_INSTALL.groupSuffix)
        .argParser((value: string) => {
          if (!isValidGroupSuffix(value))
            throw new InvalidArgumentError(
              `${JSON.stringify(value)} is not a DNS subdomain like sealion.dev`,
            );
          return value;
        }),
    )
    .addOption(
      new Option('--namespace <name>', 'namespace of the concierge')
        .default(DEFAULT_INSTALL.namespace)
        .argParser(namespaceName),
    )
    .addOption(
      new Option('--agent-namespace <name>', 'namespace of the agent')
        .default(DEFAULT_INSTALL.agentNamespace)
        .argParser(namespaceName),
    )
    .option('--image <ref>', 'container image of the concierge and the agent', DEFAULT_INSTALL.image)
    .option(
      '--forwarding-policy <name>',
      `what the hub's own forwarding identity may do on the hub: ${POLICY_NAMES.join(', ')}, or clusterrole:<name>`,
      'full',
    )
    .option(
      '--forwarding-identities <kinds>',
      'whom it may act as: users (always), serviceaccounts, nodes',
      'users',
    )
    .option(
      '--output-dir <dir>',
      'write crds/, concierge/ and agent/ kustomize folders here instead of printing',
    )
    .addHelpText(
      'after',
      `
Examples:
  sealion manifests | kubectl apply -f -
  sealion manifests agent | kubectl --context managed apply -f -
  sealion manifests concierge --forwarding-policy no-exec | kubectl apply -f -
  sealion manifests --group-suffix pinniped.dev --namespace pinniped-concierge --output-dir out
  kubectl apply -k out/concierge`,
    )
    .action(
      (
        components: string[],
        flags: InstallOptions & {
          outputDir?: string;
          forwardingPolicy: string;
          forwardingIdentities: string;
        },
      ) => {
        const unknown = components.filter((c) => !COMPONENTS.includes(c as Component));
        if (unknown.length > 0)
          throw new Error(`unknown component ${unknown.join(', ')}: use ${COMPONENTS.join(', ')}`);
        const opts: InstallOptions = {
          groupSuffix: flags.groupSuffix,
          namespace: flags.namespace,
          agentNamespace: flags.agentNamespace,
          image: flags.image,
          forwardingPolicy: parsePolicy({
            policy: flags.forwardingPolicy,
            identities: flags.forwardingIdentities,
          }),
        };
        if (flags.outputDir) {
          writeKustomize(flags.outputDir, opts);
          console.error(`wrote ${COMPONENTS.map((c) => `${flags.outputDir}/${c}`).join(', ')}`);
          return;
        }
        process.stdout.write(toYaml(components.flatMap((c) => componentObjects(c as Component, opts))));
      },
    );
}
