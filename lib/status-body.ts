// The Kubernetes Status object that every error Sealion makes itself carries (the proxy's and the agent's), as
// kubectl and client-go expect.

const REASONS: Record<number, string> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  408: 'Timeout',
  413: 'RequestEntityTooLarge',
  422: 'Invalid',
  429: 'TooManyRequests',
  431: 'RequestHeaderFieldsTooLarge',
  500: 'InternalError',
  502: 'BadGateway',
  503: 'ServiceUnavailable',
  504: 'Timeout',
};

/** A Status body for an HTTP status code. */
export function statusBody(code: number, message: string, details?: object): string {
  return JSON.stringify({
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason: REASONS[code] ?? 'Unknown',
    ...(details ? { details } : {}),
    code,
  });
}
