// The object a Kubernetes protobuf body names (application/vnd.kubernetes.protobuf, which kubectl sends for the
// built-in kinds): the API server's audit events name it from the decoded body at every level, so Sealion's must too.
// Only what that takes is read, without the kinds' schemas: the envelope (the magic `k8s\0`, then a runtime.Unknown
// whose field 2 is the object's bytes), then the object's field 1, its ObjectMeta (every generated kind puts it
// there), and of that the name (1), namespace (3), uid (5) and resourceVersion (6).

const MAGIC = Buffer.from([0x6b, 0x38, 0x73, 0x00]);

export interface ObjectMetaNames {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
}

/** The length-delimited fields of one message, by number (the first of each); undefined when it is malformed. */
function fields(message: Buffer): Map<number, Buffer> | undefined {
  const found = new Map<number, Buffer>();
  let at = 0;
  const varint = (): number | undefined => {
    let value = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (at >= message.length) return undefined;
      const byte = message[at++]!;
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
    }
    return undefined;
  };
  while (at < message.length) {
    const key = varint();
    if (key === undefined) return undefined;
    const wire = key % 8;
    const number = Math.floor(key / 8);
    if (wire === 0) {
      if (varint() === undefined) return undefined;
    } else if (wire === 1) at += 8;
    else if (wire === 5) at += 4;
    else if (wire === 2) {
      const length = varint();
      if (length === undefined || at + length > message.length) return undefined;
      if (!found.has(number)) found.set(number, message.subarray(at, at + length));
      at += length;
    } else return undefined;
  }
  return at === message.length ? found : undefined;
}

/** The names the object in a Kubernetes protobuf body carries in its metadata, or undefined when it is not one. */
export function protobufObjectMeta(body: Buffer): ObjectMetaNames | undefined {
  if (body.length < MAGIC.length || !body.subarray(0, MAGIC.length).equals(MAGIC)) return undefined;
  const raw = fields(body.subarray(MAGIC.length))?.get(2);
  const metadata = raw && fields(raw)?.get(1);
  const meta = metadata && fields(metadata);
  if (!meta) return undefined;
  const text = (n: number): string | undefined => {
    const value = meta.get(n)?.toString('utf8');
    return value ? value : undefined;
  };
  const names: ObjectMetaNames = {};
  const name = text(1);
  const namespace = text(3);
  const uid = text(5);
  const resourceVersion = text(6);
  if (name) names.name = name;
  if (namespace) names.namespace = namespace;
  if (uid) names.uid = uid;
  if (resourceVersion) names.resourceVersion = resourceVersion;
  return names;
}
