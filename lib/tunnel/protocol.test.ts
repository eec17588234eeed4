// The version skew policy: which tunnel protocols an agent and a hub talk across, and what each is told otherwise.
import { describe, expect, it } from '@jest/globals';
import {
  CURRENT_PROTOCOL,
  parseProtocol,
  skewProblem,
  supportedRange,
  withinSkew,
  type ProtocolVersion,
} from './protocol.ts';
import { TUNNEL_PROTOCOL, TUNNEL_VERSION } from './tunnel.ts';

const v = (major: number, minor: number): ProtocolVersion => ({ major, minor });

describe('parseProtocol', () => {
  it.each([
    ['2.1', v(2, 1)],
    ['2', v(2, 0)],
    [' 3.10 ', v(3, 10)],
  ])('reads %j', (text, want) => expect(parseProtocol(text)).toEqual(want));

  it.each([undefined, '', '2.', '.1', '2.1.0', 'v2', '-1.0', '2.x', '12345.0', ['2.1'], 2])(
    'states nothing for %j',
    (text) => expect(parseProtocol(text)).toBeUndefined(),
  );

  it('reads what this build sends', () => {
    expect(parseProtocol(TUNNEL_VERSION)).toEqual(CURRENT_PROTOCOL);
    // The major alone, where hubs of 2.0 look, reads as the major's first minor: within the policy.
    expect(withinSkew(CURRENT_PROTOCOL, parseProtocol(TUNNEL_PROTOCOL)!)).toBe(true);
  });
});

describe('withinSkew', () => {
  it.each([
    [v(2, 1), v(2, 1), true],
    [v(2, 1), v(2, 0), true],
    [v(2, 1), v(2, 2), true],
    [v(2, 0), v(2, 1), true],
    [v(2, 1), v(2, 3), false],
    [v(2, 3), v(2, 1), false],
    [v(2, 1), v(3, 1), false],
    [v(2, 1), v(1, 1), false],
  ])('%j and %j: %s', (ours, theirs, want) => {
    expect(withinSkew(ours, theirs)).toBe(want);
    // The policy is the same either way round: what a hub serves, an agent talks to.
    expect(withinSkew(theirs, ours)).toBe(want);
  });

  it('holds today’s agents, which state `2`, within the policy of this build', () =>
    expect(withinSkew(CURRENT_PROTOCOL, parseProtocol('2')!)).toBe(true));
});

describe('skewProblem', () => {
  it('says nothing within the policy', () => expect(skewProblem(v(2, 1), v(2, 2))).toBeUndefined());

  it.each([
    [
      v(2, 3),
      v(2, 1),
      'the agent speaks tunnel protocol 2.1 and the hub 2.3, which serves agents of 2.2 to 2.4: upgrade the agent',
    ],
    [
      v(2, 1),
      v(3, 0),
      'the agent speaks tunnel protocol 3.0 and the hub 2.1, which serves agents of 2.0 to 2.2: upgrade the hub',
    ],
  ])('hub %j, agent %j: one line that says which to upgrade', (hub, agent, want) =>
    expect(skewProblem(hub, agent)).toBe(want),
  );

  it('names no minor below 0', () => expect(supportedRange(v(4, 0))).toBe('4.0 to 4.1'));
});
