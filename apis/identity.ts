// identity.concierge.<suffix>/v1alpha1: WhoAmIRequest echoes the user the impersonation proxy sees.
import type { ObjectMeta } from './meta.ts';

export interface KubernetesUserInfo {
  user: {
    username: string;
    uid?: string;
    groups?: string[];
    extra?: Record<string, string[]>;
  };
  audiences?: string[];
}

export interface WhoAmIRequest {
  apiVersion: string;
  kind: 'WhoAmIRequest';
  metadata?: ObjectMeta;
  spec?: Record<string, never>;
  status?: { kubernetesUserInfo: KubernetesUserInfo };
}
