// The zlib dictionary every SPDY/3 header block is compressed with (SPDY/3 draft, section 2.6.10.1): a fact of the
// protocol, not a choice. The spec lists it as bytes; it is a run of header names and values, each after its length
// as a 32-bit big-endian integer, then a run of bare strings (status codes and phrases, dates, content types). It is
// written below in that shape, so a reader can check it against the spec word by word. terminal-streams.test.ts checks
// its Adler-32 against the one zlib wrote into a real spdystream session's headers, which names the dictionary.

const LENGTH_PREFIXED = [
  'options',
  'head',
  'post',
  'put',
  'delete',
  'trace',
  'accept',
  'accept-charset',
  'accept-encoding',
  'accept-language',
  'accept-ranges',
  'age',
  'allow',
  'authorization',
  'cache-control',
  'connection',
  'content-base',
  'content-encoding',
  'content-language',
  'content-length',
  'content-location',
  'content-md5',
  'content-range',
  'content-type',
  'date',
  'etag',
  'expect',
  'expires',
  'from',
  'host',
  'if-match',
  'if-modified-since',
  'if-none-match',
  'if-range',
  'if-unmodified-since',
  'last-modified',
  'location',
  'max-forwards',
  'pragma',
  'proxy-authenticate',
  'proxy-authorization',
  'range',
  'referer',
  'retry-after',
  'server',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'user-agent',
  'vary',
  'via',
  'warning',
  'www-authenticate',
  'method',
  'get',
  'status',
  '200 OK',
  'version',
  'HTTP/1.1',
  'url',
  'public',
  'set-cookie',
  'keep-alive',
  'origin',
];

const BARE = [
  '100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505',
  '203 Non-Authoritative Information',
  '204 No Content',
  '301 Moved Permanently',
  '400 Bad Request',
  '401 Unauthorized',
  '403 Forbidden',
  '404 Not Found',
  '500 Internal Server Error',
  '501 Not Implemented',
  '503 Service Unavailable',
  'Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ',
  'Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT',
  'chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,',
  'text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.',
];

function build(): Buffer {
  const parts: Buffer[] = [];
  for (const word of LENGTH_PREFIXED) {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(word.length);
    parts.push(length, Buffer.from(word, 'latin1'));
  }
  parts.push(Buffer.from(BARE.join(''), 'latin1'));
  return Buffer.concat(parts);
}

export const SPDY3_DICTIONARY: Buffer = build();
