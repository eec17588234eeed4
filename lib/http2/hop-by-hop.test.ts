import { describe, expect, it } from '@jest/globals';
import { fieldsOf } from './request.ts';
import { endToEnd, hopByHop } from './hop-by-hop.ts';

/**
 * Fields a client may send on one HTTP/1.1 connection (Node's client sends them as given), every one of which belongs
 * to that connection alone.
 */
export const HOP_FIELDS = {
  connection: 'keep-alive, X-Hop-Secret , x-also',
  'keep-alive': 'timeout=5',
  'proxy-connection': 'keep-alive',
  te: 'trailers',
  'http2-settings': 'AAMAAABkAAQCAAAAAAIAAAAA',
  'x-hop-secret': 'named by Connection',
  'x-also': 'named by Connection too',
};

describe('what crosses a hop', () => {
  it('drops pseudo-headers, the connection fields and every field the Connection field names', () => {
    const out = endToEnd({
      ...HOP_FIELDS,
      trailer: 'x-checksum',
      expect: '100-continue',
      ':path': '/api',
      host: 'example.com',
      'transfer-encoding': 'chunked',
      upgrade: 'h2c',
      accept: 'application/json',
      'x-end-to-end': 'kept',
    });
    expect(out).toEqual({ accept: 'application/json', 'x-end-to-end': 'kept' });
  });

  it('reads a Connection field given as several fields', () => {
    const dropped = hopByHop({ connection: ['close', 'x-one,x-two'] });
    expect(['x-one', 'x-two', 'close', 'connection'].map(dropped)).toEqual([true, true, true, true]);
    expect(dropped('x-three')).toBe(false);
  });

  it('drops what the hop adds to the list, and keeps everything else', () => {
    expect(endToEnd({ authorization: 'Bearer t', accept: '*/*' }, (n) => n === 'authorization')).toEqual({
      accept: '*/*',
    });
  });
});

describe("fields named as Object's own properties", () => {
  const RAW = [
    'Constructor',
    'a',
    '__proto__',
    'b',
    'toString',
    'c',
    'constructor',
    'd',
    'hasOwnProperty',
    'e',
  ];

  it('are fields like any other, read from the raw list (constructor once threw and cost the request a 500)', () => {
    const fields = fieldsOf(RAW, () => false);
    expect(Object.entries(fields)).toEqual([
      ['constructor', ['a', 'd']],
      ['__proto__', 'b'],
      ['tostring', 'c'],
      ['hasownproperty', 'e'],
    ]);
  });

  it('cross a hop as fields, and never become the prototype of what crosses', () => {
    const headers = fieldsOf(RAW, () => false);
    const out = endToEnd(headers);
    expect(Object.getPrototypeOf(out)).toBeNull();
    expect(Object.entries(out)).toEqual(Object.entries(headers));
  });
});
