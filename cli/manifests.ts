// `sealion manifests`: the install manifests for any group suffix, namespace and image.
import { Command, InvalidArgumentError, Option } from 'commander';
import { isValidGroupSuffix } from '../apis/groups.ts';
import { parsePolicy, POLICY_NAMES } from '../manifests/forwarding-policy.ts';
import { DEFAULT_INSTALL, type InstallOptions } from '../manifests/install.ts';
import type { Component } from '../manifests/render.ts';
import { isDNSLabel } from '../apis/names.ts';

const COMPONENTS: readonly Component[] = ['crds', 'concierge', 'agent'];

function namespaceName(value: string): string {
  if (!isDNSLabel(value)) throw new InvalidArgumentError(`${JSON.stringify(value)} is not a namespace name`);
  return value;
}

const kebab = (name: string): string => name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);

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
      '--values <file>',
      "settings as the Helm charts' values (values.yaml): the concierge chart's for crds and concierge, the agent chart's for agent",
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
  sealion manifests --values my-values.yaml --output-dir out     # what helm install -f my-values.yaml makes
  kubectl apply -k out/concierge`,
    )
    .action(
      async (
        components: string[],
        flags: InstallOptions & {
          outputDir?: string;
          values?: string;
          forwardingPolicy: string;
          forwardingIdentities: string;
        },
        command: Command,
      ) => {
        // Loaded here: completion and help load every command's module, and these take a while.
        const [
          { componentObjects, toYaml, writeKustomize, writeKustomizeFolder },
          { agentObjects, conciergeInstall },
        ] = await Promise.all([import('../manifests/render.ts'), import('../manifests/chart.ts')]);
        const unknown = components.filter((c) => !COMPONENTS.includes(c as Component));
        if (unknown.length > 0)
          throw new Error(`unknown component ${unknown.join(', ')}: use ${COMPONENTS.join(', ')}`);
        if (flags.values) {
          // Values say everything the other flags would but the namespaces, which are Helm's --namespace.
          // Read as Helm reads values files: YAML 1.1, where yes is true and 022 is 18.
          const [{ readFileSync }, { parse }] = await Promise.all([import('node:fs'), import('yaml')]);
          const given: unknown = parse(readFileSync(flags.values, 'utf8'), { version: '1.1' }) ?? {};
          if (typeof given !== 'object' || given === null || Array.isArray(given))
            throw new Error(`${flags.values}: not a map of values`);
          const values = given as Record<string, unknown>;
          const agent = components.includes('agent');
          if (agent && components.length > 1)
            throw new Error(
              '--values: the agent has a chart of its own, so name crds and concierge, or agent',
            );
          // The other flags would be a second answer to what the values say.
          const flagged = (
            ['groupSuffix', 'image', 'forwardingPolicy', 'forwardingIdentities'] as const
          ).filter((name) => command.getOptionValueSource(name) === 'cli');
          if (flagged.length > 0)
            throw new Error(
              `--values says what ${flagged.map((n) => `--${kebab(n)}`).join(', ')} would: set it there`,
            );
          const install = agent ? undefined : conciergeInstall(values, flags.namespace);
          const objects = (c: Component): Record<string, unknown>[] =>
            install ? componentObjects(c, install) : agentObjects(values, flags.agentNamespace);
          if (flags.outputDir) {
            // The concierge's folder names ../crds.
            const folders = new Set(components as Component[]);
            if (folders.has('concierge')) folders.add('crds');
            for (const c of folders) writeKustomizeFolder(flags.outputDir, c, objects(c));
            console.error(`wrote ${[...folders].map((c) => `${flags.outputDir}/${c}`).join(', ')}`);
            return;
          }
          process.stdout.write(toYaml(components.flatMap((c) => objects(c as Component))));
          return;
        }
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
