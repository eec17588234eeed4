// How help describes options, for every command of the tree. Many options default to '' in the code (a value
// always present) and say their real default in words: `--kubeconfig <path>  (default: $KUBECONFIG, else
// ~/.kube/config)`. commander then added its own `(default: "")` after it. Here an option or argument whose description
// states its default keeps commander's out, once for the whole tree, so a new option cannot bring it back
// (cli/command-tree.test.ts walks every command's help).
import type { Argument, Command, Help, Option } from 'commander';

/** Whether a description says its default itself. */
const statesDefault = (description: string): boolean => description.includes('(default');

/** `what` as commander's help sees it, without a default to add. */
const withoutDefault = <T extends Option | Argument>(what: T): T =>
  Object.assign(Object.create(what) as T, { defaultValue: undefined });

/** Configures `root` and every command under it to say each default once (see above). */
export function sayEachDefaultOnce(root: Command): void {
  root.configureHelp({
    ...root.configureHelp(),
    optionDescription(this: Help, option: Option): string {
      const proto = Object.getPrototypeOf(this) as Help;
      return proto.optionDescription.call(
        this,
        statesDefault(option.description) ? withoutDefault(option) : option,
      );
    },
    argumentDescription(this: Help, argument: Argument): string {
      const proto = Object.getPrototypeOf(this) as Help;
      return proto.argumentDescription.call(
        this,
        statesDefault(argument.description) ? withoutDefault(argument) : argument,
      );
    },
  });
  for (const sub of root.commands) sayEachDefaultOnce(sub);
}
