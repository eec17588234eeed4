// POST /register at a tunnel listener, as anyone may, with whatever body the caller chooses: how the tests see the
// listener's answers (its status, Retry-After and body) to registrations good and bad.
import { request } from 'node:https';

export interface RegisterAnswer {
  status: number;
  retryAfter?: string;
  body: string;
}

/** `body` is sent as JSON unless it is a string, which is sent as it is. */
export function postRegister(port: number, caPem: string, body: object | string): Promise<RegisterAnswer> {
  return new Promise((done, fail) => {
    const req = request(
      { host: '127.0.0.1', port, path: '/register', method: 'POST', ca: caPem, agent: false },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () =>
          done({
            status: res.statusCode ?? 0,
            ...(res.headers['retry-after'] ? { retryAfter: res.headers['retry-after'] } : {}),
            body: text,
          }),
        );
      },
    );
    req.once('error', fail);
    req.end(typeof body === 'string' ? body : JSON.stringify(body));
  });
}
