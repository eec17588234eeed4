// An OpenID Provider as a client sees it: openid-client's configuration from the issuer's discovery document, with
// its calls trusting the given CA bundle (or the system roots without one) and bounded in time. The CLI's logins
// and the SSH door's device logins both start here.
import * as oidc from 'openid-client';
import { Agent, fetch as undiciFetch } from 'undici';

/** Each call to the issuer (discovery, device authorization, token endpoint) must answer within this. */
export const ISSUER_TIMEOUT_S = 15;

export interface IssuerClient {
  issuer: string;
  clientId: string;
  /** Base64 PEM CA bundle the issuer's certificate chains to; none: the system roots. */
  caBundleData?: string;
}

/**
 * The issuer's configuration for a public client (no client secret: PKCE and device codes are how it proves
 * itself). `close` ends the keep-alive connections to the issuer. Throws openid-client's errors unchanged, for the
 * caller to explain.
 */
export async function issuerConfiguration(
  client: IssuerClient,
): Promise<{ config: oidc.Configuration; close: () => Promise<void> }> {
  const options: oidc.DiscoveryRequestOptions = {};
  let dispatcher: Agent | undefined;
  if (client.caBundleData) {
    dispatcher = new Agent({
      connect: { ca: Buffer.from(client.caBundleData, 'base64').toString('utf8') },
    });
    const through = dispatcher;
    options[oidc.customFetch] = (url, init) => undiciFetch(url, { ...(init as object), dispatcher: through });
  }
  options.timeout = ISSUER_TIMEOUT_S;
  let config: oidc.Configuration;
  try {
    config = await oidc.discovery(new URL(client.issuer), client.clientId, undefined, oidc.None(), options);
  } catch (err) {
    await dispatcher?.close();
    throw err;
  }
  config.timeout = ISSUER_TIMEOUT_S;
  return { config, close: async () => dispatcher?.close() };
}
