// A scripted browser for the local OIDC issuer (dev/oidc-issuer.ts): it follows redirects by hand, keeps cookies
// as a browser would, and submits the issuer's forms, so that tests log in through the real authorization and
// device flows without a browser. It knows the issuer's pages only by their forms and their `data-outcome`.
import { spawn, type ChildProcess } from 'node:child_process';
import { quote } from 'shell-quote';
import { CookieJar } from 'tough-cookie';
import { Agent, fetch } from 'undici';

export interface BrowserOptions {
  /** PEM CA that signed the issuer's serving certificate. */
  caPem: string;
  /** Requests before giving up, so that a redirect loop fails instead of hanging. Default: 20. */
  maxSteps?: number;
}

interface Page {
  url: string;
  status: number;
  body: string;
}

interface Form {
  action: string;
  fields: Record<string, string>;
}

/** Each page and the callback must answer within this. */
const REQUEST_TIMEOUT_MS = 20_000;
const DEFAULT_MAX_STEPS = 20;
const LOOPBACKS = new Set(['127.0.0.1', 'localhost', '[::1]']);

const NAMED_ENTITIES: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"' };
const unescapeHTML = (text: string): string =>
  text.replace(/&(amp|lt|gt|quot|#(\d+));/g, (_all, name: string, code?: string) =>
    code ? String.fromCharCode(Number(code)) : NAMED_ENTITIES[name]!,
  );

const attributes = (tag: string): Record<string, string> =>
  Object.fromEntries([...tag.matchAll(/([\w.-]+)="([^"]*)"/g)].map(([, k, v]) => [k!, unescapeHTML(v!)]));

/** The forms of a page with their hidden and text inputs; buttons outside a form are not part of it. */
function formsOf(page: Page): Form[] {
  return [...page.body.matchAll(/<form\b([^>]*)>([\s\S]*?)<\/form>/g)].map(([, tag, inner]) => {
    const fields: Record<string, string> = {};
    for (const [, input] of inner!.matchAll(/<input\b([^>]*)>/g)) {
      const { name, value } = attributes(input!);
      if (name) fields[name] = value ?? '';
    }
    return { action: new URL(attributes(tag!)['action'] ?? '', page.url).href, fields };
  });
}

/** What a page says, without its markup, title, forms and buttons, short enough for an error message. */
const textOf = (page: Page): string =>
  page.body
    .replace(/<(head|form|button)\b[\s\S]*?<\/\1>/g, ' ')
    .replace(/<[^>]*>/g, ' ')
    .replace(/\s+/g, ' ')
    .trim()
    .slice(0, 300);

const outcomeOf = (page: Page): string | undefined => /data-outcome="([^"]*)"/.exec(page.body)?.[1];

/** One browser session: its own cookies, trusting the issuer's CA. */
class Browser {
  private readonly jar = new CookieJar();
  private readonly dispatcher: Agent;
  private steps: number;

  constructor(opts: BrowserOptions) {
    this.dispatcher = new Agent({ connect: { ca: opts.caPem } });
    this.steps = opts.maxSteps ?? DEFAULT_MAX_STEPS;
  }

  /** One request, without following redirects. */
  private async request(url: string, form?: Record<string, string>): Promise<Page & { location?: string }> {
    if (--this.steps < 0) throw new Error(`browser: too many requests, the last to ${url}`);
    const cookie = await this.jar.getCookieString(url);
    const answer = await fetch(url, {
      method: form ? 'POST' : 'GET',
      redirect: 'manual',
      headers: { accept: 'text/html', ...(cookie ? { cookie } : {}) },
      ...(form ? { body: new URLSearchParams(form) } : {}),
      dispatcher: this.dispatcher,
      // A stuck page fails the test that asked for it, well before the test's own timeout.
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    for (const set of answer.headers.getSetCookie()) await this.jar.setCookie(set, url);
    const body = await answer.text();
    const location = answer.headers.get('location');
    return {
      url,
      status: answer.status,
      body,
      ...(location ? { location: new URL(location, url).href } : {}),
    };
  }

  /**
   * Loads `url` (or posts `form` to it) and follows redirects until a page answers, or until a redirect leaves
   * the issuer for a loopback http address: that is the native client's callback, returned unvisited.
   */
  async open(url: string, form?: Record<string, string>): Promise<Page | { callback: string }> {
    let page = await this.request(url, form);
    while (page.status >= 300 && page.status < 400 && page.location) {
      const next = new URL(page.location);
      if (next.protocol === 'http:' && LOOPBACKS.has(next.hostname)) return { callback: next.href };
      page = await this.request(next.href);
    }
    return page;
  }

  /** Submits a page's first form; a page without one is an error, with what it says. */
  async submit(page: Page, fill: Record<string, string> = {}): Promise<Page | { callback: string }> {
    const form = formsOf(page)[0];
    if (!form)
      throw new Error(`browser: ${page.url} answered ${page.status} without a form: ${textOf(page)}`);
    return this.open(form.action, { ...form.fields, ...fill });
  }

  async close(): Promise<void> {
    await this.dispatcher.close();
  }
}

/**
 * Opens a login link (the CLI's local one, which redirects to the authorization URL, or an authorization URL),
 * passes the issuer's login and consent, and requests the loopback callback it redirects to (the CLI's localhost
 * server, plain http). Resolves with the callback's answer; throws with the
 * issuer's page when the flow stops there.
 */
export async function browse(url: string, opts: BrowserOptions): Promise<{ status: number; body: string }> {
  const browser = new Browser(opts);
  try {
    const page = await browser.open(url);
    if (!('callback' in page)) {
      throw new Error(`browse: ${page.url} answered ${page.status}: ${textOf(page)}`);
    }
    const answer = await fetch(page.callback, { signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
    return { status: answer.status, body: await answer.text() };
  } finally {
    await browser.close();
  }
}

/**
 * Approves a device login as its user would: enters the user code (or opens the link that carries it), confirms
 * the device, and passes the login. Resolves once the issuer says the device is approved; throws with the issuer's
 * message otherwise (a wrong or used code, a denied consent).
 */
export async function approveDevice(
  verification: string | { verificationUri: string; userCode: string },
  opts: BrowserOptions,
): Promise<void> {
  const browser = new Browser(opts);
  try {
    const start = typeof verification === 'string' ? verification : verification.verificationUri;
    let page = await browser.open(start);
    if (typeof verification !== 'string' && !('callback' in page) && outcomeOf(page) === 'input') {
      page = await browser.submit(page, { user_code: verification.userCode });
    }
    for (;;) {
      if ('callback' in page) throw new Error(`approveDevice: redirected to ${page.callback}`);
      const outcome = outcomeOf(page);
      if (outcome === 'approved') return;
      if (outcome === 'error' || outcome === 'input' || page.status >= 400) {
        throw new Error(`approveDevice: ${page.url} answered ${page.status}: ${textOf(page)}`);
      }
      // The self-submitting page that carries the code, then the confirmation.
      page = await browser.submit(page);
    }
  } finally {
    await browser.close();
  }
}

/** What a command run by runWithLogin did. */
export interface LoginRun {
  code: number | null;
  stdout: string;
  stderr: string;
  /** Whether a login URL was printed and followed. */
  browsed: boolean;
  /** Why the browser could not finish the login, when it could not (the command was then stopped). */
  browserError?: string;
}

/**
 * Runs a command whose login prints a URL to standard error (`sealion login oidc`, or kubectl or the sealion CLI
 * running it as a plugin) and plays the person at the browser: the code flow's "in a browser:" URL through browse(),
 * or the device flow's "or open" link through approveDevice(). The command runs in a process group of its own, so
 * that stopping it stops the plugin too; it is stopped when the browser fails (it would wait minutes for its
 * callback) or after `timeoutMs`. `caPem` may be a function: the issuer's CA can be read once the URL shows.
 */
export function runWithLogin(
  command: string,
  args: string[],
  opts: {
    caPem: string | (() => string);
    env?: NodeJS.ProcessEnv;
    cwd?: string;
    /** Default: 120 s. */
    timeoutMs?: number;
    /** Called with the process at its start, for a caller that must stop it whatever happens. */
    track?: (child: ChildProcess) => void;
    /**
     * Give the command a terminal as its standard input, as a person's shell does (its output stays apart, on
     * pipes). kubectl tells its login plugin whether a person can answer by that alone. Default: false.
     */
    terminal?: boolean;
  },
): Promise<LoginRun> {
  return new Promise((done) => {
    const child = opts.terminal
      ? // util-linux's script runs the command on a new pseudo-terminal; the command's output goes to the pipes on
        // file descriptors 3 and 4, which script's child inherits, rather than through the terminal.
        spawn(
          'script',
          [
            '--quiet',
            '--return',
            '--command',
            `exec ${quote([command, ...args])} 1>&3 2>&4 3>&- 4>&-`,
            '/dev/null',
          ],
          {
            env: { ...process.env, ...opts.env, SHELL: '/bin/sh' },
            ...(opts.cwd ? { cwd: opts.cwd } : {}),
            detached: true,
            stdio: ['pipe', 'ignore', 'ignore', 'pipe', 'pipe'],
          },
        )
      : spawn(command, args, {
          env: { ...process.env, ...opts.env },
          ...(opts.cwd ? { cwd: opts.cwd } : {}),
          detached: true,
        });
    opts.track?.(child);
    const stdoutStream = (opts.terminal ? child.stdio[3] : child.stdout) as NodeJS.ReadableStream;
    const stderrStream = (opts.terminal ? child.stdio[4] : child.stderr) as NodeJS.ReadableStream;
    const stop = (): void => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // Already gone.
      }
    };
    const timer = setTimeout(stop, opts.timeoutMs ?? 120_000);
    let stdout = '';
    let stderr = '';
    let browsed = false;
    let browserError: string | undefined;
    stdoutStream.on('data', (c: Buffer) => (stdout += c.toString()));
    stderrStream.on('data', (c: Buffer) => {
      stderr += c.toString();
      const url = / in a browser:\n {2}(https?:\/\/\S+)\n/.exec(stderr)?.[1];
      const device = /\n {2}or open (https:\/\/\S+)\n/.exec(stderr)?.[1];
      if ((!url && !device) || browsed) return;
      browsed = true;
      const caPem = typeof opts.caPem === 'string' ? opts.caPem : opts.caPem();
      (url ? browse(url, { caPem }) : approveDevice(device!, { caPem })).catch((err: unknown) => {
        browserError = (err as Error).message;
        stop();
      });
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr, browsed, ...(browserError ? { browserError } : {}) });
    });
  });
}
