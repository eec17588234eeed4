// config.concierge.<suffix>/v1alpha1: CredentialIssuer, the singleton kept for clients written against Pinniped
// (its CLI reads status.strategies[].frontend). Sealion's settings are edited in its ConfigMap; the spec holds the
// settings in effect, which is also where a restarted concierge finds them while the ConfigMap holds a bad edit.
import type { AccessPolicy } from './access.ts';
import type { ObjectMeta } from './meta.ts';
import type { StrategyReason, StrategyStatus } from './authentication.ts';

export type ProxyMode = 'auto' | 'enabled' | 'disabled';
export type KubeCertAgentMode = 'auto' | 'enabled' | 'disabled';
export type ServiceType = 'LoadBalancer' | 'ClusterIP' | 'None';
export type ExternalTrafficPolicy = 'Local' | 'Cluster';

/** The Service in front of the impersonation proxy. */
export interface ImpersonationProxyServiceSpec {
  /** LoadBalancer (default), ClusterIP, or None (then externalEndpoint is required). */
  type?: ServiceType;
  /**
   * The IP address to ask the cloud's load balancer for.
   * @maxLength 255
   */
  loadBalancerIP?: string;
  /** Annotations for the Service, for example the cloud's load balancer settings. */
  annotations?: Record<string, string>;
  /**
   * Local (default): the load balancer sends traffic only to nodes that run a replica, which see clients' own
   * addresses; Cluster: to any node, which hides them behind its own.
   */
  externalTrafficPolicy?: ExternalTrafficPolicy;
}

/** The impersonation proxy settings in effect, in Pinniped's shape. */
export interface ImpersonationProxySpec {
  /** auto: run it when the cluster looks managed (EKS, AKS, GKE, or no control-plane nodes); enabled; disabled. */
  mode: ProxyMode;
  /** The Service in front of the proxy. */
  service?: ImpersonationProxyServiceSpec;
  /**
   * host[:port] that clients use to reach the proxy, when it is not the Service's address.
   * @maxLength 255
   */
  externalEndpoint?: string;
  /** The proxy's serving certificate, when it is not generated. */
  tls?: ImpersonationProxyTLSSpec;
}

/** A serving certificate of the user's own for the impersonation proxy. */
export interface ImpersonationProxyTLSSpec {
  /**
   * A kubernetes.io/tls Secret in the concierge's namespace.
   * @maxLength 253
   */
  secretName?: string;
  /**
   * Base64-encoded PEM CA bundle to advertise for that certificate.
   * @format byte
   */
  certificateAuthorityData?: string;
}

/** Sealion's own setting beyond Pinniped's shape: whether to offer the TokenCredentialRequest API. */
export interface KubeCertAgentSpec {
  /**
   * The TokenCredentialRequest API on the cluster's own API server, with certificates the cluster signs. auto: on
   * self-hosted-looking clusters (a control-plane node, no managed provider's marks); enabled; disabled. Pinniped's
   * name, kept so that its settings carry over; Sealion runs no agent for it.
   */
  mode: KubeCertAgentMode;
}

/** Sealion's own settings beyond Pinniped's shape: what access requests call the hub, and its access policy. */
export interface AccessRequestsSpec {
  /**
   * What access requests (spec.clusters) call the hub. A Cluster of this name makes it ambiguous: requests naming
   * it are refused.
   * @maxLength 63
   */
  hubName: string;
  /** Who may ask for what on the hub itself, and whether every request to it must carry a reason. */
  hub: AccessPolicy;
}

/** Sealion's own setting beyond Pinniped's shape: the SSH door (off unless enabled). */
export interface SSHSpec {
  /** enabled or disabled. */
  mode: 'enabled' | 'disabled';
  /**
   * The port of the proxy's Service that SSH clients connect to.
   * @minimum 1
   * @maximum 65535
   */
  port?: number;
  /**
   * What SSH targets call the hub's own cluster.
   * @maxLength 63
   */
  hubName?: string;
  /** The device login at a JWTAuthenticator's issuer; absent: only bound keys and certificates sign in. */
  login?: SSHLoginSpec;
  /**
   * The SSH CAs whose user certificates sign in, one public key each as in authorized_keys.
   * @maxItems 32
   */
  certificateAuthorities?: string[];
  /**
   * The certificate extension whose value is the user's groups, comma-separated.
   * @maxLength 128
   */
  groupsExtension?: string;
  /** Certificates may name users and groups that start with `system:` (Kubernetes' own). Default: false. */
  allowSystemNames?: boolean;
  /**
   * How long a device login keeps a key bound at most, renewals with the issuer's refresh token included, as a
   * duration in hours, minutes and seconds (`12h`, `1h30m`), from 5m to 168h. Default: 12h.
   * @maxLength 32
   */
  maxBindingLifetime?: string;
}

/** The SSH door's device login. */
export interface SSHLoginSpec {
  /**
   * The JWTAuthenticator whose issuer runs the device authorization grant, and which authenticates its ID tokens.
   * @maxLength 253
   */
  authenticator: string;
  /**
   * The OAuth client the door asks as; empty: the authenticator's audience.
   * @maxLength 256
   */
  clientID?: string;
  /**
   * The scopes asked for.
   * @maxItems 20
   */
  scopes?: string[];
}

/**
 * The concierge's settings in effect. Sealion reads its configuration from the concierge ConfigMap and mirrors
 * it here, for clients written against Pinniped and for itself: a concierge that starts while the ConfigMap holds
 * a bad edit keeps these settings. Edits here are overwritten.
 */
export interface CredentialIssuerSpec {
  /** The impersonation proxy settings in effect. */
  impersonationProxy?: ImpersonationProxySpec;
  /** The TokenCredentialRequest API's setting in effect. */
  kubeCertAgent?: KubeCertAgentSpec;
  /** The SSH door's settings in effect. */
  ssh?: SSHSpec;
  /** The access requests' settings in effect. */
  accessRequests?: AccessRequestsSpec;
}

export type FrontendType = 'TokenCredentialRequestAPI' | 'ImpersonationProxy';

/** How to reach the TokenCredentialRequest API. */
export interface TokenCredentialRequestAPIInfo {
  /**
   * The Kubernetes API server URL.
   * @pattern ^https://
   */
  server: string;
  /**
   * Base64-encoded PEM CA bundle for the server.
   * @format byte
   */
  certificateAuthorityData: string;
}

/** How to reach the impersonation proxy. */
export interface ImpersonationProxyInfo {
  /**
   * The proxy's https URL.
   * @pattern ^https://
   */
  endpoint: string;
  /**
   * Base64-encoded PEM CA bundle for the proxy.
   * @format byte
   */
  certificateAuthorityData: string;
}

/** How a client uses a strategy. */
export interface CredentialIssuerFrontend {
  /** TokenCredentialRequestAPI or ImpersonationProxy. */
  type: FrontendType;
  /** Set when type is TokenCredentialRequestAPI. */
  tokenCredentialRequestInfo?: TokenCredentialRequestAPIInfo;
  /** Set when type is ImpersonationProxy. */
  impersonationProxyInfo?: ImpersonationProxyInfo;
}

/**
 * CertificateSigningRequest is Sealion's: certificates the cluster signs through its CSR API (Pinniped's
 * KubeClusterSigningCertificate copies the signing key out of the controller-manager instead), served by the
 * TokenCredentialRequestAPI frontend.
 */
export type IssuerStrategyType = 'CertificateSigningRequest' | 'ImpersonationProxy';

/** One way the concierge can issue credentials, in Pinniped's shape. */
export interface CredentialIssuerStrategy {
  /** CertificateSigningRequest or ImpersonationProxy. */
  type: IssuerStrategyType;
  /** Success, Error or NotAvailable. */
  status: StrategyStatus;
  /** A machine-readable reason for the status. */
  reason: StrategyReason;
  /** A human-readable explanation. */
  message: string;
  /**
   * When this entry last changed.
   * @format date-time
   */
  lastUpdateTime: string;
  /** How clients use this strategy; set only on Success. */
  frontend?: CredentialIssuerFrontend;
}

/** A host key of the SSH door, for clients to pin. */
export interface SSHHostKey {
  /** The key's algorithm, e.g. ssh-ed25519. */
  algorithm: string;
  /** The public key as a known_hosts line has it after the host: `<algorithm> <base64>`. */
  publicKey: string;
  /** OpenSSH's fingerprint of it: `SHA256:<base64>`, as `ssh` prints it on first contact. */
  fingerprint: string;
}

/** The SSH door as clients reach it. */
export interface SSHStatus {
  /** Success when it serves, Error when it should and cannot. */
  status: StrategyStatus;
  /** What it is doing, or why not. */
  message: string;
  /**
   * host:port SSH clients connect to, once the Service has an address.
   * @maxLength 300
   */
  endpoint?: string;
  /** Its host keys. */
  hostKeys?: SSHHostKey[];
}

/** Observed state, written by the concierge only. */
export interface CredentialIssuerStatus {
  /** The strategies the concierge offers, best first. */
  strategies?: CredentialIssuerStrategy[];
  /** The SSH door, when it is enabled. */
  ssh?: SSHStatus;
}

/** Describes how clients obtain credentials for this cluster (deprecated: read the authenticators' status). */
export interface CredentialIssuer {
  apiVersion: string;
  kind: 'CredentialIssuer';
  metadata: ObjectMeta;
  spec: CredentialIssuerSpec;
  status?: CredentialIssuerStatus;
}
