// The one place the proxy asks "who is this token?". A JWT goes straight to the authenticators whose issuer
// matches its (unverified) `iss`; any other token goes to the webhooks. The controllers fill it.
import { hash } from 'node:crypto';
import { decodeJwt } from 'jose';
import { LRUCache } from 'lru-cache';
import { fail, JWT_SHAPE, oversized, type AuthResult, type TokenAuthenticator } from './types.ts';

export type AuthenticatorKind = 'JWTAuthenticator' | 'WebhookAuthenticator';

interface Entry {
  kind: AuthenticatorKind;
  name: string;
  authenticator: TokenAuthenticator & { close?: () => void };
  /** For JWT authenticators: the issuer tokens must name. */
  issuer?: string;
  /** The lifetime of client certificates issued on its word (its spec.credentialLifetimeSeconds). */
  credentialLifetimeSeconds?: number;
  /** What certificates issued on its word are bound to; they hold only while this entry is loaded with it. */
  binding?: AuthenticatorBinding;
  /** Its spec accepts `system:` names (spec.allowSystemNames), so certificates may carry them. */
  allowSystemNames?: boolean;
  /** For JWT authenticators: where its issuer is and how to trust it, for logins (the SSH door's device login). */
  provider?: IssuerProvider;
}

/** A JWT authenticator's issuer as a login reaches it: its URL, the audience its tokens name, the CA it trusts. */
export interface IssuerProvider {
  issuer: string;
  audience: string;
  caBundlePem?: string;
}

/**
 * What a TokenCredentialRequest certificate is bound to: the authenticator object (its metadata.uid, so one deleted
 * and made again under its name is another) and the digest of what its spec trusts (trust.ts), so that an edit of
 * whom it trusts ends the certificates issued before the edit.
 */
export interface AuthenticatorBinding {
  uid: string;
  trust: string;
}

/** What an authenticator is loaded with besides itself. */
export interface AuthenticatorSettings {
  issuer?: string;
  provider?: IssuerProvider;
  credentialLifetimeSeconds?: number;
  binding?: AuthenticatorBinding;
  allowSystemNames?: boolean;
}

/**
 * Successful answers given again without decoding the token or asking its authenticator: kubectl sends the same
 * token with every request, and a JWT's signature check costs more than the rest of authentication. The one
 * cache of reusable answers (a JWT authenticator says how long its answer holds). Bounded; keyed by the token's
 * SHA-256, never the token.
 */
export const REUSED_ANSWERS = 10_000;

function issuerOf(token: string): string | undefined {
  if (!JWT_SHAPE.test(token)) return undefined;
  try {
    const iss = decodeJwt(token).iss;
    return typeof iss === 'string' ? iss : undefined;
  } catch {
    return undefined;
  }
}

/** A reusable answer, and whether it came from the JWTAuthenticators that take the token's issuer. */
interface Reused {
  result: AuthResult;
  byIssuer: boolean;
  /** Milliseconds since the epoch: the answer's reusableUntil, after which it is never given. */
  until: number;
  /** `result`, resolved: what authenticate returns for it. */
  answer: Promise<AuthResult>;
}

/** The certificate lifetime the entries allow: the shortest one set, or none (the default then holds). */
function lifetimeOf(...entries: (Entry | undefined)[]): { credentialLifetimeSeconds?: number } {
  const set = entries.flatMap((e) =>
    e?.credentialLifetimeSeconds === undefined ? [] : [e.credentialLifetimeSeconds],
  );
  return set.length === 0 ? {} : { credentialLifetimeSeconds: Math.min(...set) };
}

export class AuthenticatorCache {
  private readonly entries = new Map<string, Entry>();
  private byIssuer = new Map<string, Entry[]>();
  private webhooks: Entry[] = [];
  /** The loaded authenticators' trust digests by uid: asked on every request a bound certificate makes. */
  private bindings = new Map<string, string>();
  /**
   * Answers that carry reusableUntil, each given until then and never after (`fresh` compares it with the clock at
   * every lookup). Emptied whenever an authenticator changes. lru-cache's own TTL is not used: it reads
   * performance.now and keeps start and TTL arrays for every entry, which cost a remembered token about a tenth of
   * its time, for the same comparison; an answer past its time is dropped when it is next looked up, or evicted as
   * the least recently used, so the cache stays within REUSED_ANSWERS either way.
   */
  private readonly reused = new LRUCache<string, Reused>({ max: REUSED_ANSWERS });
  private readonly now: () => number;
  /** Bumped by every change, so an answer from before a change is never remembered after it. */
  private generation = 0;

  /** `now`: milliseconds since the epoch, what answers' reusableUntil is compared with. Default: Date.now. */
  constructor(options: { now?: () => number } = {}) {
    this.now = options.now ?? Date.now;
  }

  /** The answer kept under `key` while it may still be given. */
  private fresh(key: string): Reused | undefined {
    const reused = this.reused.get(key);
    if (reused === undefined) return undefined;
    if (reused.until > this.now()) return reused;
    this.reused.delete(key);
    return undefined;
  }

  private static key(kind: AuthenticatorKind, name: string): string {
    return `${kind}/${name}`;
  }

  /** Adds or replaces an authenticator; the one it replaces is closed. */
  set(
    kind: AuthenticatorKind,
    name: string,
    authenticator: Entry['authenticator'],
    settings: AuthenticatorSettings = {},
  ): void {
    const key = AuthenticatorCache.key(kind, name);
    const previous = this.entries.get(key);
    this.entries.set(key, { kind, name, authenticator, ...settings });
    this.reindex();
    if (previous && previous.authenticator !== authenticator) previous.authenticator.close?.();
  }

  delete(kind: AuthenticatorKind, name: string): void {
    const key = AuthenticatorCache.key(kind, name);
    const previous = this.entries.get(key);
    if (!previous) return;
    this.entries.delete(key);
    this.reindex();
    previous.authenticator.close?.();
  }

  /** The issuer of the JWTAuthenticator `name`, when it is loaded (validated and in use) now. */
  providerOf(name: string): IssuerProvider | undefined {
    return this.entries.get(AuthenticatorCache.key('JWTAuthenticator', name))?.provider;
  }

  has(kind: AuthenticatorKind, name: string): boolean {
    return this.entries.has(AuthenticatorCache.key(kind, name));
  }

  /**
   * Whether a certificate bound to `binding` holds: the authenticator object with that uid is loaded now (not
   * deleted, replaced or broken) with a spec that trusts what it trusted when the certificate was issued.
   */
  holds(binding: AuthenticatorBinding): boolean {
    return this.bindings.get(binding.uid) === binding.trust;
  }

  get size(): number {
    return this.entries.size;
  }

  private reindex(): void {
    // Sorted by name, so that which authenticator answers first never depends on creation order.
    const all = [...this.entries.values()].sort((a, b) => a.name.localeCompare(b.name));
    const byIssuer = new Map<string, Entry[]>();
    for (const e of all)
      if (e.issuer !== undefined) byIssuer.set(e.issuer, [...(byIssuer.get(e.issuer) ?? []), e]);
    this.byIssuer = byIssuer;
    this.webhooks = all.filter((e) => e.kind === 'WebhookAuthenticator');
    this.bindings = new Map(
      all.flatMap((e) => (e.binding ? [[e.binding.uid, e.binding.trust] as const] : [])),
    );
    this.generation++;
    this.reused.clear();
  }

  /** Whether `token` is a JWT whose issuer a JWTAuthenticator here takes. */
  takesIssuerOf(token: string): boolean {
    const iss = issuerOf(token);
    return iss !== undefined && this.byIssuer.has(iss);
  }

  /**
   * The answer kept for `token` from the JWTAuthenticators that take its issuer, if one is kept: what authenticate
   * would give such a token, found by the token's hash alone. Most requests repeat a token already verified, and
   * decoding it to learn its issuer first (takesIssuerOf) cost the proxy more than the rest of their authentication.
   * Answers are dropped whenever an authenticator changes, so one kept is from the same authenticators as now.
   */
  reusedAnswer(token: string): AuthResult | undefined {
    if (token === '' || oversized(token)) return undefined;
    const reused = this.fresh(hash('sha256', token, 'base64url'));
    return reused?.byIssuer ? reused.result : undefined;
  }

  /**
   * Authenticates against every applicable authenticator; the first success wins. A remembered answer comes back as
   * the promise made when it was remembered: no promise, and no async function's, is made per request for it.
   */
  authenticate(token: string, signal?: AbortSignal): Promise<AuthResult> {
    if (token === '') return Promise.resolve(fail('empty token'));
    const tooLarge = oversized(token);
    if (tooLarge) return Promise.resolve(tooLarge);
    const key = hash('sha256', token, 'base64url');
    const reused = this.fresh(key);
    return reused ? reused.answer : this.authenticateAnew(token, key, signal);
  }

  /** Asks the authenticators about a token not answered from the cache, and remembers a reusable answer. */
  private async authenticateAnew(token: string, key: string, signal?: AbortSignal): Promise<AuthResult> {
    const generation = this.generation;
    const iss = issuerOf(token);
    const jwtEntries = iss === undefined ? undefined : this.byIssuer.get(iss);
    const result = await this.ask(token, iss, jwtEntries, signal);
    this.remember(key, result, generation, jwtEntries !== undefined);
    return result;
  }

  private async ask(
    token: string,
    iss: string | undefined,
    jwtEntries: Entry[] | undefined,
    signal?: AbortSignal,
  ): Promise<AuthResult> {
    if (jwtEntries) return this.first(jwtEntries, token, signal);
    if (this.webhooks.length === 0)
      return fail(
        iss === undefined ? 'no webhook authenticator configured' : `no authenticator for issuer ${iss}`,
      );
    return this.first(this.webhooks, token, signal);
  }

  /**
   * Authenticates with one named authenticator (TokenCredentialRequest names it). A success carries the lifetime
   * that authenticator gives certificates, read from the same entry that answered.
   */
  async authenticateWith(
    kind: AuthenticatorKind,
    name: string,
    token: string,
    signal?: AbortSignal,
  ): Promise<
    AuthResult & {
      credentialLifetimeSeconds?: number;
      binding?: AuthenticatorBinding;
      allowSystemNames?: boolean;
    }
  > {
    const entry = this.entries.get(AuthenticatorCache.key(kind, name));
    if (!entry) return fail(`no ready ${kind} named ${name}`);
    const tooLarge = oversized(token);
    if (tooLarge) return tooLarge;
    // Kept apart from the answers for any authenticator: this one's answer must not become the answer a bearer
    // token gets when several authenticators take it.
    const key = `${AuthenticatorCache.key(kind, name)}:${hash('sha256', token, 'base64url')}`;
    const reused = this.fresh(key);
    // The binding of the entry that answers, read before the answer: if the spec is edited meanwhile, the certificate
    // is bound to the spec that checked the token, and ends with it.
    const binding = {
      ...(entry.binding ? { binding: entry.binding } : {}),
      ...(entry.allowSystemNames ? { allowSystemNames: true } : {}),
    };
    if (reused) return { ...reused.result, ...lifetimeOf(entry), ...binding };
    const generation = this.generation;
    const result = await this.first([entry], token, signal);
    this.remember(key, result, generation, false);
    // The spec may have been edited while the token was checked: the shorter of the two lifetimes holds.
    const now = this.entries.get(AuthenticatorCache.key(kind, name));
    return { ...result, ...lifetimeOf(entry, now), ...binding };
  }

  /** Keeps a reusable answer until it says, unless an authenticator changed since it was asked for. */
  private remember(key: string, result: AuthResult, generation: number, byIssuer: boolean): void {
    if (!result.ok || result.reusableUntil === undefined || generation !== this.generation) return;
    if (result.reusableUntil > this.now())
      this.reused.set(key, {
        result,
        byIssuer,
        until: result.reusableUntil,
        answer: Promise.resolve(result),
      });
  }

  private async first(entries: Entry[], token: string, signal?: AbortSignal): Promise<AuthResult> {
    const results = await Promise.all(
      entries.map(async (e) => {
        const r = await e.authenticator.authenticate(token, signal);
        return r.ok
          ? { ...r, authenticator: `${e.kind}/${e.name}` }
          : { ok: false as const, reason: `${e.kind}/${e.name}: ${r.reason}` };
      }),
    );
    return results.find((r) => r.ok) ?? fail(results.map((r) => (r.ok ? '' : r.reason)).join('; '));
  }

  close(): void {
    for (const e of this.entries.values()) e.authenticator.close?.();
    this.entries.clear();
    this.reindex();
  }
}
