import { describe, expect, it } from '@jest/globals';
import { parseRecordingList } from './peering.ts';

const body = (value: unknown): Buffer => Buffer.from(JSON.stringify(value));

describe("another replica's list of recordings", () => {
  it('takes a filtered page: its items checked, each field cut to its bound, and how many more matched', () => {
    const page = parseRecordingList(
      body({
        items: [
          {
            id: 'a',
            bytes: 10,
            modified: '2026-11-28T10:00:00.000Z',
            started: '2026-11-28T09:59:00.000Z',
            kind: 'sftp',
            user: 'u'.repeat(300),
            cluster: 'hub',
            command: ['x'.repeat(600), 'y'],
            pod: 42,
          },
          { id: 'b', bytes: 'many', modified: '2026-11-28T10:00:00.000Z' },
          null,
        ],
        remaining: 7,
      }),
      'replica-b',
    );
    expect(page).toEqual({
      found: [
        {
          id: 'a',
          bytes: 10,
          modified: '2026-11-28T10:00:00.000Z',
          started: '2026-11-28T09:59:00.000Z',
          kind: 'sftp',
          user: 'u'.repeat(256),
          cluster: 'hub',
          command: ['x'.repeat(512)],
          replica: 'replica-b',
        },
      ],
      remaining: 7,
    });
  });

  it('takes the plain array of a replica from before filtered lists, as it is', () => {
    expect(
      parseRecordingList(body([{ id: 'a', bytes: 1, modified: '2026-11-28T10:00:00.000Z' }]), 'old'),
    ).toEqual({
      found: [{ id: 'a', bytes: 1, modified: '2026-11-28T10:00:00.000Z', replica: 'old' }],
      remaining: 0,
    });
  });

  it('refuses an answer that is no list', () => {
    expect(() => parseRecordingList(body({ items: 'none' }), 'x')).toThrow('the answer is not a list');
    expect(() => parseRecordingList(body({ items: [], remaining: -3 }), 'x')).not.toThrow();
  });
});
