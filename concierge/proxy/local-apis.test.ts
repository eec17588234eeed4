import { describe, expect, it } from '@jest/globals';
import { localAPIs, type LocalAPI } from './local-apis.ts';

const entry = (paths: string[], who: LocalAPI['who'] = 'anonymous'): LocalAPI => ({
  paths,
  who,
  serve: () => {},
});

describe('the local-API table', () => {
  const list = entry(['/apis/g/v1', '/apis/g/v1/']);
  const below = entry(['/apis/g/v1/*'], 'authenticated');
  const table = localAPIs([list, below]);

  it('finds an exact path before a path below one', () => {
    expect(table.find('/apis/g/v1', 'GET')).toBe(list);
    expect(table.find('/apis/g/v1/', 'GET')).toBe(list);
    expect(table.find('/apis/g/v1/things', 'GET')).toBe(below);
    expect(table.find('/apis/g/v1/things/x', 'GET')).toBe(below);
  });

  it('finds nothing for a path it does not serve, nor for a sibling that shares a prefix', () => {
    expect(table.find('/apis/g/v10/things', 'GET')).toBeUndefined();
    expect(table.find('/apis/g', 'GET')).toBeUndefined();
    expect(table.find('/api/v1/pods', 'GET')).toBeUndefined();
  });

  it('refuses two entries for one path when it is built', () => {
    expect(() => localAPIs([entry(['/healthz']), entry(['/healthz'])])).toThrow(
      'two local APIs answer /healthz',
    );
  });
});
