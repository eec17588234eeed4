import { describe, expect, it } from '@jest/globals';
import { protobufObjectMeta } from './protobuf-meta.ts';

/** A ConfigMap as a real kube-apiserver (v1.36.3) encodes it, asked with Accept: application/vnd.kubernetes.protobuf. */
const CONFIGMAP = Buffer.from(
  '6b3873000a0f0a0276311209436f6e6669674d617012ba010aa4010a0c726561646d652d636865636b12001a0464656d6f22002a2433366562633563362d326639652d346265612d383465372d643730656562313239613935320337343438004208088ba3a0d80610008a01520a0e6b75626563746c2d63726561746512065570646174651a0276312208088ba3a0d806100032084669656c647356313a1e0a1c7b22663a64617461223a7b222e223a7b7d2c22663a6b223a7b7d7d7d420012110a016b120c726561646d652d76616c75651a002200',
  'hex',
);

describe('the names in a Kubernetes protobuf body', () => {
  it('reads the name, namespace, uid and resourceVersion of a real API server encoding', () => {
    expect(protobufObjectMeta(CONFIGMAP)).toEqual({
      name: 'readme-check',
      namespace: 'demo',
      uid: '36ebc5c6-2f9e-4bea-84e7-d70eeb129a95',
      resourceVersion: '744',
    });
  });

  it.each([
    ['no envelope', Buffer.from('{"metadata":{"name":"x"}}')],
    ['a cut message', CONFIGMAP.subarray(0, CONFIGMAP.length - 7)],
    ['a length past the end', Buffer.concat([CONFIGMAP.subarray(0, 4), Buffer.from([0x12, 0xff, 0x01])])],
    ['the magic alone', CONFIGMAP.subarray(0, 4)],
  ])('gives nothing for %s', (_what, body) => {
    expect(protobufObjectMeta(body)).toBeUndefined();
  });
});
