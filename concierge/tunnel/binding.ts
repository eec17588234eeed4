// What an agent certificate is bound to, read from a Cluster object, and whether a binding still holds against the
// registry's current object; the binding's format is the install contract's (apis/agent-binding.ts). The
// certificate's subject is for people; nothing reads an identity from it.
import type { TLSSocket } from 'node:tls';
import type { Cluster } from '../../apis/tunnel.ts';
import {
  BINDING_URI_PREFIX,
  parseBindingURI,
  UID,
  validGeneration,
  type AgentBinding,
} from '../../apis/agent-binding.ts';
import { isDNSLabel } from '../../apis/names.ts';
import { certificateURIs } from '../../lib/pki/pki.ts';

/** The binding a certificate issued now for `cluster` gets. Throws when the object lacks a valid name or UID. */
export function currentBinding(cluster: Cluster): AgentBinding {
  const binding = {
    cluster: cluster.metadata.name ?? '',
    uid: cluster.metadata.uid ?? '',
    generation: cluster.spec.agentGeneration ?? 0,
  };
  if (!isDNSLabel(binding.cluster)) throw new Error('the Cluster has no valid name');
  if (!UID.test(binding.uid)) throw new Error(`Cluster ${binding.cluster} has no valid uid`);
  if (!validGeneration(binding.generation))
    throw new Error(`Cluster ${binding.cluster} has an invalid spec.agentGeneration`);
  return binding;
}

/**
 * Why a certificate's binding no longer holds against `cluster`, the registry's current object of that name
 * (undefined: there is none), or undefined when it holds.
 */
export function bindingProblem(binding: AgentBinding, cluster: Cluster | undefined): string | undefined {
  if (!cluster) return `cluster ${binding.cluster} is not in the registry`;
  if (cluster.metadata.uid !== binding.uid)
    return `the certificate was issued for an earlier Cluster ${binding.cluster} (uid ${binding.uid}, now ${String(cluster.metadata.uid)})`;
  const generation = cluster.spec.agentGeneration ?? 0;
  if (generation !== binding.generation)
    return `the certificate is of agent generation ${binding.generation}; Cluster ${binding.cluster} accepts only ${generation} (revoked)`;
  return undefined;
}

/** The binding a verified client certificate carries, or why there is none. */
export function peerBinding(socket: TLSSocket): { binding: AgentBinding } | { problem: string } {
  if (!socket.authorized)
    return { problem: `no valid client certificate (${String(socket.authorizationError)})` };
  const cert = socket.getPeerX509Certificate();
  if (!cert) return { problem: 'no client certificate' };
  if (!cert.keyUsage?.includes('1.3.6.1.5.5.7.3.2'))
    return { problem: 'the certificate is not for client authentication' };
  // Certificates from before bindings existed name the cluster only in their subject: they are refused, since
  // nothing in them tells one Cluster of a name from a later one.
  const uris = certificateURIs(cert.raw).filter((uri) => uri.startsWith(BINDING_URI_PREFIX));
  if (uris.length !== 1) return { problem: 'the certificate carries no single cluster binding' };
  const binding = parseBindingURI(uris[0]!);
  if (!binding) return { problem: 'the certificate carries a malformed cluster binding' };
  return { binding };
}

/** What peerBinding found. */
export type VerifiedPeer = ReturnType<typeof peerBinding>;
