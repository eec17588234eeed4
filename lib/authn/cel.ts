// CEL expressions as Kubernetes' structured authentication configuration has them (AuthenticationConfiguration's
// claimValidationRules, claimMappings and userValidationRules), on @marcbachmann/cel-js: the one JavaScript CEL that
// type-checks expressions and has the optional syntax (`claims.?x.orValue("")`) the API server enables, at a fraction
// of the cost per evaluation of the others (measured: 0.3-0.6 µs against 1.2-9 µs for @bufbuild/cel).
//
// Compiled once per spec (parsed and type-checked; an error names the expression and its line and column), evaluated
// per token. The library has no cost budget, as cel-go's is in the API server (1,000,000 per call, "roughly 0.1
// second"): a token's expressions that could cost more than a pass over its claims (nested comprehensions, regular
// expressions) run inside one `node:vm` call with that deadline, so a pathological one ends there as an error rather
// than pinning the CPU; the parser's structural limits bound an expression's size, and the token's size bounds the
// rest.
import { runInContext, createContext } from 'node:vm';
import { Environment, EvaluationError } from '@marcbachmann/cel-js';

/** Where an expression stands in the configuration, which decides its variable and the result it must have. */
export type ExpressionKind = 'username' | 'uid' | 'groups' | 'extra' | 'claimValidation' | 'userValidation';

/** What one token's expressions may take together, as the API server's cost limit per call is about 0.1 s. */
export const EVALUATION_DEADLINE_MS = 100;
/** The longest expression accepted, in characters: far above any real mapping. */
export const MAX_EXPRESSION_LENGTH = 10 * 1024;

const LIMITS = {
  maxAstNodes: 1000,
  maxDepth: 32,
  maxListElements: 1000,
  maxMapEntries: 1000,
  maxCallArguments: 32,
};
/** A CEL int (a BigInt here) as a JavaScript index. */
const index = (n: bigint | number): number => Number(n);
/** Whether `a` sorts after `b` (CEL values of one kind: int, uint, double or string), for isSorted, min and max. */
const greater = (a: unknown, b: unknown): boolean => (a as number) > (b as number);

/** string.replace(from, to, n): the first n replacements (all when n is negative), as cel-go's strings extension. */
function replaceN(s: string, from: string, to: string, n: bigint): string {
  if (index(n) < 0) return s.split(from).join(to);
  const parts = s.split(from);
  const replaced = Math.min(index(n), parts.length - 1);
  return (
    parts.slice(0, replaced + 1).join(to) +
    (replaced < parts.length - 1 ? from + parts.slice(replaced + 1).join(from) : '')
  );
}

/**
 * What the API server's CEL environment has beyond the library's (cel-go's strings extension and Kubernetes' regex and
 * lists libraries), as far as authentication expressions use them. Not yet: the sets extension and Kubernetes' url,
 * ip, cidr, quantity and semver libraries (an expression using them is refused when compiled, naming the function).
 */
function withKubernetesLibraries(environment: Environment): Environment {
  return (
    environment
      // Strings.
      .registerFunction('string.charAt(int): string', (s: string, i: bigint) => {
        const chars = [...s];
        if (index(i) < 0 || index(i) > chars.length) throw new Error(`index out of range: ${index(i)}`);
        return chars[index(i)] ?? '';
      })
      .registerFunction('string.replace(string, string): string', (s: string, from: string, to: string) =>
        s.split(from).join(to),
      )
      .registerFunction('string.replace(string, string, int): string', replaceN)
      // Regular expressions (Kubernetes' regex library): costly, so guarded, as matches is.
      .registerFunction(
        'string.find(string): string',
        (s: string, re: string) => new RegExp(re, 'u').exec(s)?.[0] ?? '',
      )
      .registerFunction('string.findAll(string): list<string>', (s: string, re: string) =>
        [...s.matchAll(new RegExp(re, 'gu'))].map((m) => m[0]),
      )
      .registerFunction('string.findAll(string, int): list<string>', (s: string, re: string, n: bigint) => {
        const all = [...s.matchAll(new RegExp(re, 'gu'))].map((m) => m[0]);
        return index(n) < 0 ? all : all.slice(0, index(n));
      })
      // Lists (Kubernetes' lists library).
      .registerFunction('list.isSorted(): bool', (l: unknown[]) =>
        l.every((v, i) => i === 0 || !greater(l[i - 1], v)),
      )
      .registerFunction('list.sum(): dyn', (l: unknown[]) =>
        l.reduce<unknown>((a, v) => (a as number) + (v as number), typeof l[0] === 'bigint' ? 0n : 0),
      )
      .registerFunction('list.min(): dyn', (l: unknown[]) => {
        if (l.length === 0) throw new Error('min called on an empty list');
        return l.reduce((a, v) => (greater(a, v) ? v : a));
      })
      .registerFunction('list.max(): dyn', (l: unknown[]) => {
        if (l.length === 0) throw new Error('max called on an empty list');
        return l.reduce((a, v) => (greater(v, a) ? v : a));
      })
      .registerFunction('list.indexOf(dyn): int', (l: unknown[], v: unknown) => BigInt(l.indexOf(v)))
      .registerFunction('list.lastIndexOf(dyn): int', (l: unknown[], v: unknown) => BigInt(l.lastIndexOf(v)))
  );
}

const base = withKubernetesLibraries(
  new Environment({ enableOptionalTypes: true, homogeneousAggregateLiterals: true, limits: LIMITS }),
);
/** `claims`: the token's payload, a map of anything; `user`: the mapped identity, for userValidationRules. */
const claimsEnvironment = base.clone().registerVariable('claims', 'map<string, dyn>');
const userEnvironment = base.clone().registerVariable({
  name: 'user',
  schema: { username: 'string', uid: 'string', groups: 'list<string>', extra: 'map<string, list<string>>' },
});

/**
 * Validation rules must be bool when compiled, as the API server checks them (a `dyn` result is refused there too).
 * Mappings are checked when they run, as there: the API server takes `1` as a username expression and refuses every
 * token, and so does this.
 */
const BOOLEAN_KINDS = new Set<ExpressionKind>(['claimValidation', 'userValidation']);

/** An expression that cannot be used, with where in it the problem is. */
export class ExpressionError extends Error {
  readonly expression: string;
  /** 1-based, where the problem starts; absent when it is the expression as a whole. */
  readonly line?: number;
  readonly column?: number;
  constructor(expression: string, problem: string, offset?: number) {
    const at = offset === undefined ? undefined : lineColumn(expression, offset);
    super(at ? `${at.line}:${at.column}: ${problem}` : problem);
    this.name = 'ExpressionError';
    this.expression = expression;
    if (at) {
      this.line = at.line;
      this.column = at.column;
    }
  }
}

function lineColumn(text: string, offset: number): { line: number; column: number } {
  const before = text.slice(0, Math.max(0, Math.min(offset, text.length))).split('\n');
  return { line: before.length, column: before.at(-1)!.length + 1 };
}

export interface CompiledExpression {
  readonly kind: ExpressionKind;
  readonly expression: string;
  /**
   * Whether it can cost more than a pass over the token's claims: comprehensions nested in comprehensions (each level
   * multiplies the work) or a regular expression (JavaScript's can backtrack exponentially). Only such expressions pay
   * for the deadline's guard, about 0.25 ms a call; the rest are linear in the token's size, which is bounded.
   */
  readonly guarded: boolean;
  /** Evaluates with `claims` or `user`; throws what the expression's evaluation throws. Call through evaluateAll. */
  readonly run: (variables: Record<string, unknown>) => unknown;
}

const COMPREHENSIONS = new Set(['all', 'exists', 'exists_one', 'map', 'filter']);

/** The deepest nesting of comprehensions in the AST, and whether it matches a regular expression. */
function costShape(node: unknown): { depth: number; regex: boolean } {
  if (Array.isArray(node))
    return node.reduce<{ depth: number; regex: boolean }>(
      (acc, n) => {
        const shape = costShape(n);
        return { depth: Math.max(acc.depth, shape.depth), regex: acc.regex || shape.regex };
      },
      { depth: 0, regex: false },
    );
  if (!node || typeof node !== 'object') return { depth: 0, regex: false };
  const n = node as { op?: unknown; args?: unknown };
  const inner = costShape(n.args);
  const name: unknown =
    (n.op === 'rcall' || n.op === 'call') && Array.isArray(n.args) ? (n.args as unknown[])[0] : undefined;
  return {
    depth: inner.depth + (typeof name === 'string' && COMPREHENSIONS.has(name) ? 1 : 0),
    regex: inner.regex || name === 'matches' || name === 'find' || name === 'findAll',
  };
}

/** Whether the AST uses `cel.bind`, which the API server's environment does not have. */
function usesBind(node: unknown): boolean {
  if (Array.isArray(node)) return node.some(usesBind);
  if (!node || typeof node !== 'object') return false;
  const n = node as { op?: unknown; args?: unknown };
  if (n.op === 'rcall' && Array.isArray(n.args) && n.args[0] === 'bind') {
    const receiver = n.args[1] as { op?: unknown; args?: unknown } | undefined;
    if (receiver?.op === 'id' && receiver.args === 'cel') return true;
  }
  return Array.isArray(n.args) && n.args.some(usesBind);
}

/** Parses and type-checks `expression` for `kind`; throws ExpressionError saying what is wrong and where. */
export function compileExpression(kind: ExpressionKind, expression: string): CompiledExpression {
  if (expression.trim() === '') throw new ExpressionError(expression, 'the expression is empty');
  if (expression.length > MAX_EXPRESSION_LENGTH)
    throw new ExpressionError(expression, `the expression is over ${MAX_EXPRESSION_LENGTH} characters`);
  const environment = kind === 'userValidation' ? userEnvironment : claimsEnvironment;
  const checked = environment.check(expression);
  if (!checked.valid) {
    const error = checked.error as
      { summary?: string; message: string; range?: { start: number } } | undefined;
    throw new ExpressionError(
      expression,
      error?.summary ?? error?.message ?? 'does not compile',
      error?.range?.start,
    );
  }
  const type = String(checked.type).replace(/\s+/g, '');
  if (BOOLEAN_KINDS.has(kind) && type !== 'bool')
    throw new ExpressionError(expression, `must evaluate to bool, not ${type}`);
  const program = environment.parse(expression);
  if (usesBind(program.ast)) throw new ExpressionError(expression, 'cel.bind is not available');
  const shape = costShape(program.ast);
  return {
    kind,
    expression,
    guarded: shape.depth >= 2 || shape.regex,
    run: (variables) => program(variables) as unknown,
  };
}

const guard = createContext({});

/**
 * Runs each of `expressions` with `variables`, all within EVALUATION_DEADLINE_MS: an array of each one's result, or
 * an Error (an evaluation error, such as a missing claim) in its place. Throws when the deadline passed.
 */
export function evaluateAll(
  expressions: readonly CompiledExpression[],
  variables: Record<string, unknown>,
  deadlineMs: number = EVALUATION_DEADLINE_MS,
): unknown[] {
  if (expressions.length === 0) return [];
  const results: unknown[] = [];
  const runAll = (): void => {
    for (const e of expressions) {
      try {
        results.push(e.run(variables));
      } catch (err) {
        results.push(err instanceof Error ? err : new Error(String(err)));
      }
    }
  };
  if (!expressions.some((e) => e.guarded)) {
    runAll();
    return results;
  }
  (guard as { run?: () => void }).run = runAll;
  try {
    runInContext('run()', guard, { timeout: deadlineMs });
  } catch (err) {
    if ((err as { code?: string }).code === 'ERR_SCRIPT_EXECUTION_TIMEOUT')
      throw new Error(`the expressions took more than ${deadlineMs} ms`, { cause: err });
    throw err;
  } finally {
    (guard as { run?: () => void }).run = undefined;
  }
  return results;
}

/** What an evaluation error says, with where in the expression, for the log (never for the client). */
export function evaluationProblem(expression: CompiledExpression, err: Error): string {
  const at =
    err instanceof EvaluationError && err.range
      ? lineColumn(expression.expression, err.range.start)
      : undefined;
  const summary = err instanceof EvaluationError ? (err.summary ?? err.message) : err.message;
  return `expression ${JSON.stringify(expression.expression)}${at ? ` at ${at.line}:${at.column}` : ''}: ${summary}`;
}

/**
 * A mapped value as the API server takes it for groups and extra values: a string (one value), a list of strings, or
 * null (none); empty strings dropped. Undefined when it is none of those.
 */
export function stringsResult(value: unknown): string[] | undefined {
  if (value === null) return [];
  if (typeof value === 'string') return value === '' ? [] : [value];
  if (Array.isArray(value) && value.every((v) => typeof v === 'string')) return value.filter((v) => v !== '');
  return undefined;
}
