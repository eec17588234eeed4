// The format of what an agent certificate is bound to: one Cluster object (its name and its UID, so a Cluster deleted
// and created again under the same name is another cluster) and the generation of agent certificates that Cluster
// accepted when the certificate was issued (spec.agentGeneration; raising it revokes every older certificate).
// The binding travels in the certificate as one URI SAN, urn:sealion:cluster:<name>:<uid>:<generation>, built
// from parts that are each checked against a strict alphabet without ':', so the URI splits back into exactly
// those parts. Part of the install contract (install.ts): the concierge writes it, and tools outside it read it.
import { isDNSLabel } from './names.ts';

export interface AgentBinding {
  cluster: string;
  uid: string;
  generation: number;
}

export const BINDING_URI_PREFIX = 'urn:sealion:cluster:';

/** Kubernetes UIDs are RFC 4122 UUIDs in their lowercase text form. */
export const UID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** The CRD caps agentGeneration at 2^31-1; no leading zeros, so one number has one spelling. */
const GENERATION = /^(0|[1-9][0-9]{0,9})$/;
const MAX_GENERATION = 2 ** 31 - 1;

export const validGeneration = (n: number): boolean => Number.isInteger(n) && n >= 0 && n <= MAX_GENERATION;

export function bindingURI(binding: AgentBinding): string {
  if (!isDNSLabel(binding.cluster) || !UID.test(binding.uid) || !validGeneration(binding.generation))
    throw new Error('an agent binding needs a DNS-label name, a UUID and a generation in 0..2^31-1');
  return `${BINDING_URI_PREFIX}${binding.cluster}:${binding.uid}:${binding.generation}`;
}

/** The binding a URI SAN names, or undefined when it is not exactly one of ours. */
export function parseBindingURI(uri: string): AgentBinding | undefined {
  if (!uri.startsWith(BINDING_URI_PREFIX)) return undefined;
  const parts = uri.slice(BINDING_URI_PREFIX.length).split(':');
  if (parts.length !== 3) return undefined;
  const [cluster, uid, generation] = parts as [string, string, string];
  if (!isDNSLabel(cluster) || !UID.test(uid) || !GENERATION.test(generation)) return undefined;
  const n = Number(generation);
  return validGeneration(n) ? { cluster, uid, generation: n } : undefined;
}
