// The tunnel protocol's version and the version skew policy, in this one place. The protocol version says what
// runs inside the tunnel and how the two ends greet each other; it is not the product's version, which may change
// with nothing on the wire changing. Each end states its own in the upgrade (TUNNEL_VERSION_HEADER: the agent in
// its request, the hub in its answer, a refusal included) and checks the other's against the policy:
//
//   an agent and a hub talk when their protocols have the same major and minors at most MAX_MINOR_SKEW apart,
//   either way.
//
// So a hub of 2.1 serves agents of 2.0 to 2.2, and an agent of 2.1 talks to hubs of 2.0 to 2.2: either end may be
// upgraded first, one minor at a time. A header rather than a first frame: the upgrade is where both transports
// (direct and WebSocket) already exchange what each end says of itself, and a refusal there costs no tunnel. The
// agent still sends the major alone in TUNNEL_PROTOCOL_HEADER, where hubs of 2.0 want exactly `2`: so they serve
// agents of 2.1, as the policy says.

export interface ProtocolVersion {
  major: number;
  minor: number;
}

/**
 * This build's tunnel protocol. 2.0: plain requests as HTTP/2 requests, the hub naming its replica; 2.1: both ends
 * state their protocol in the upgrade and hold the other to the skew policy.
 */
export const CURRENT_PROTOCOL: ProtocolVersion = { major: 2, minor: 1 };
/** How far apart two minors of one major may be for their ends to talk. */
export const MAX_MINOR_SKEW = 1;

/** The version as the header carries it, `major.minor`. */
export const formatProtocol = (v: ProtocolVersion): string => `${v.major}.${v.minor}`;

/**
 * The version a header states, or undefined when it states none that parses. `2` (what agents and hubs sent
 * before versions had a minor) is 2.0. Numbers of at most four digits: a peer cannot make this parse anything
 * large.
 */
export function parseProtocol(value: unknown): ProtocolVersion | undefined {
  if (typeof value !== 'string') return undefined;
  const match = /^(\d{1,4})(?:\.(\d{1,4}))?$/.exec(value.trim());
  if (!match) return undefined;
  return { major: Number(match[1]), minor: Number(match[2] ?? 0) };
}

/** Whether an end of protocol `ours` talks to a peer of protocol `theirs` (the policy above). */
export const withinSkew = (ours: ProtocolVersion, theirs: ProtocolVersion): boolean =>
  ours.major === theirs.major && Math.abs(ours.minor - theirs.minor) <= MAX_MINOR_SKEW;

/** The protocols an end of `ours` talks to, as `2.0 to 2.2`. */
export function supportedRange(ours: ProtocolVersion): string {
  const oldest = { major: ours.major, minor: Math.max(0, ours.minor - MAX_MINOR_SKEW) };
  const newest = { major: ours.major, minor: ours.minor + MAX_MINOR_SKEW };
  return `${formatProtocol(oldest)} to ${formatProtocol(newest)}`;
}

/** Which end is older of the two, for what to upgrade. */
const older = (a: ProtocolVersion, b: ProtocolVersion): boolean =>
  a.major < b.major || (a.major === b.major && a.minor < b.minor);

/**
 * Why the hub of protocol `hub` and the agent of protocol `agent` do not talk, in one line that says which to
 * upgrade; undefined when they do. The same sentence at both ends: the hub logs it and answers it, the agent logs it.
 */
export function skewProblem(hub: ProtocolVersion, agent: ProtocolVersion): string | undefined {
  if (withinSkew(hub, agent)) return undefined;
  const upgrade = older(agent, hub) ? 'upgrade the agent' : 'upgrade the hub';
  return (
    `the agent speaks tunnel protocol ${formatProtocol(agent)} and the hub ${formatProtocol(hub)}, ` +
    `which serves agents of ${supportedRange(hub)}: ${upgrade}`
  );
}

/** What a hub that states no protocol in its answer speaks: hubs stated theirs from 2.1 on. */
export const UNSTATED_HUB_PROTOCOL: ProtocolVersion = { major: 2, minor: 0 };
