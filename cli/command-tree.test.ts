// Rules every command of the CLI keeps, checked by walking the whole commander tree, so that a command or an option
// added later is held to them too. The subcommands are the ones main.ts loads, read off its table of modules.
import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { sayEachDefaultOnce } from './help.ts';

const MAIN = readFileSync(new URL('./main.ts', import.meta.url), 'utf8');
/** Each subcommand module main.ts loads, and the function there that makes its command. */
const LOADERS = [...MAIN.matchAll(/\(await import\('\.\/([\w-]+)\.ts'\)\)\.(\w+Command)\(/g)].map((m) => ({
  file: m[1]!,
  factory: m[2]!,
}));

/** The whole program, as `sealion --help` loads it and main.ts configures it. */
async function program(): Promise<Command> {
  const root = new Command('sealion');
  for (const { file, factory } of LOADERS) {
    const module = (await import(`./${file}.ts`)) as Record<
      string,
      (name: string) => Command | Promise<Command>
    >;
    root.addCommand(await module[factory]!('sealion'));
  }
  sayEachDefaultOnce(root);
  return root;
}

/** Every command under `root` (itself included), with its full name (`sealion get kubeconfig`). */
function walk(root: Command, prefix = ''): { name: string; command: Command }[] {
  const name = prefix ? `${prefix} ${root.name()}` : root.name();
  return [{ name, command: root }, ...root.commands.flatMap((sub) => walk(sub, name))];
}

const hasOption = (command: Command, long: string): boolean => command.options.some((o) => o.long === long);

/**
 * The server processes: their --kubeconfig is their own identity outside a cluster (a pod's is in-cluster), one
 * file made for them, not a person's kubeconfig of many contexts; they take no --context.
 */
const SERVER_PROCESSES = new Set(['sealion concierge', 'sealion agent']);

/** Commands that print data: each takes `-o, --output <format>` with json and yaml among the formats. */
const DATA_COMMANDS = [
  'sealion cluster kubeconfig',
  'sealion whoami',
  'sealion clusters',
  'sealion version',
  'sealion recordings list',
  'sealion get kubeconfig',
  'sealion get',
  'sealion auth can-i',
  'sealion ssh config',
  'sealion request create',
  'sealion request list',
  'sealion request approve',
  'sealion request deny',
  'sealion request withdraw',
  'sealion request wait',
];

/** Whether `command` takes `-o, --output` with json and yaml: as commander's choices, or checked by the command. */
function printsJsonAndYaml(command: Command | undefined): boolean {
  const output = command?.options.find((o) => o.long === '--output');
  if (output?.short !== '-o') return false;
  const formats = output.argChoices ?? output.description.split(/[\s,]+/);
  return formats.includes('json') && formats.includes('yaml');
}

describe('the command tree', () => {
  it('holds every subcommand main.ts loads', async () => {
    const names = (await program()).commands.map((c) => c.name());
    expect(names).toEqual(expect.arrayContaining(['login', 'get', 'whoami', 'version', 'completion']));
    expect(names).toHaveLength(LOADERS.length);
  });

  it('says each default once: no description carries a (default: …) that commander adds as well', async () => {
    // The help main.ts runs is configured the same way.
    expect(MAIN).toContain("(await import('./help.ts')).sayEachDefaultOnce(program);");
    const twice: string[] = [];
    for (const { name, command } of walk(await program())) {
      const help = command.createHelp();
      for (const option of help.visibleOptions(command))
        if ((help.optionDescription(option).match(/\(default/g) ?? []).length > 1)
          twice.push(`${name} ${option.flags}`);
      for (const argument of help.visibleArguments(command))
        if ((help.argumentDescription(argument).match(/\(default/g) ?? []).length > 1)
          twice.push(`${name} <${argument.name()}>`);
    }
    expect(twice).toEqual([]);
  });

  it('takes --context wherever it takes --kubeconfig', async () => {
    const missing = walk(await program())
      .filter(({ command }) => hasOption(command, '--kubeconfig') && !hasOption(command, '--context'))
      .map(({ name }) => name)
      .filter((name) => !SERVER_PROCESSES.has(name));
    expect(missing).toEqual([]);
  });

  it('takes -o json|yaml on each command that prints data', async () => {
    const commands = new Map(walk(await program()).map(({ name, command }) => [name, command]));
    const missing = DATA_COMMANDS.filter((name) => !printsJsonAndYaml(commands.get(name)));
    expect(missing).toEqual([]);
  });
});
