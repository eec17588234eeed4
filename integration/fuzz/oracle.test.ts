// The impersonation oracle's judgement, on answers as the API server at the pinned release words them to the fuzz
// user: a finding only when the API server refuses the impersonation and the same request came back through the proxy
// with the API server's Audit-Id.
import { describe, expect, it } from '@jest/globals';
import { statusBody } from '../../lib/kube/status.ts';
import { judgeImpersonation, refusesImpersonation } from './oracle.ts';
import type { Answer } from './wire.ts';

const fromApiServer = (status: number, message: string): Answer => ({
  kind: 'response',
  status,
  headers: { 'audit-id': 'a1', 'content-type': 'application/json' },
  body: statusBody(status, message),
});
const fromProxy = (status: number, message: string): Answer => ({
  kind: 'response',
  status,
  headers: { 'content-type': 'application/json' },
  body: statusBody(status, message),
});

const CLOSED: Answer = { kind: 'closed', detail: 'reset' };
const CANNOT_IMPERSONATE = fromApiServer(
  403,
  'configmaps "x" is forbidden: User "fuzzer@example.com" cannot impersonate-on:user-info:get resource "configmaps" in API group "" in the namespace "default"',
);
const LEGACY_REFUSAL = fromApiServer(
  403,
  'users "x" is forbidden: User "fuzzer@example.com" cannot impersonate resource "users" in API group "" at the cluster scope',
);
const WITHOUT_USER = fromApiServer(
  400,
  'requested &user.DefaultInfo{Name:"", UID:"u", Groups:[]string(nil), Extra:map[string][]string(nil)} without impersonating a user name',
);
const NOT_FOUND = fromApiServer(404, 'configmaps "x" not found');
const RBAC_REFUSAL = fromApiServer(
  403,
  'configmaps "x" is forbidden: User "fuzzer@example.com" cannot delete resource "configmaps" in API group "" in the namespace "default"',
);

describe('whether the API server refused an impersonation', () => {
  it.each([
    ['a constrained mode refused', CANNOT_IMPERSONATE, true],
    ['the legacy verb refused', LEGACY_REFUSAL, true],
    ['groups, a uid or extra without a user', WITHOUT_USER, true],
    ['the request served (not found)', NOT_FOUND, false],
    ['the request refused by RBAC, not the impersonation', RBAC_REFUSAL, false],
    [
      'the same words without the Audit-Id',
      fromProxy(403, 'User "u" cannot impersonate resource "users"'),
      false,
    ],
    ['no answer', CLOSED, false],
  ])('%s', (_name, direct, refused) => {
    expect(refusesImpersonation(direct)).toBe(refused);
  });
});

describe('an impersonation judged against the API server', () => {
  it.each([
    [
      'the proxy forwarded what the API server refuses',
      NOT_FOUND,
      CANNOT_IMPERSONATE,
      'impersonation-ignored',
    ],
    [
      'the proxy forwarded it and RBAC refused the caller',
      RBAC_REFUSAL,
      WITHOUT_USER,
      'impersonation-ignored',
    ],
    ['the proxy refused it itself', fromProxy(403, 'cannot impersonate'), CANNOT_IMPERSONATE, undefined],
    ['the proxy closed the stream', CLOSED, CANNOT_IMPERSONATE, undefined],
    ['the API server allows it too', NOT_FOUND, NOT_FOUND, undefined],
    ['the API server could not be asked', NOT_FOUND, CLOSED, undefined],
  ])('%s', (_name, viaProxy, direct, kind) => {
    expect(judgeImpersonation(viaProxy, direct)?.kind).toBe(kind);
  });
});
