// The committed CRD schemas and manifests must be exactly what the generator writes from apis/ today.
import { describe, expect, it } from '@jest/globals';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CHARTS_DIR, generateSchemas, schemasFileText, SCHEMAS_FILE } from './generate.ts';
import { chartFiles, CHARTS } from '../manifests/chart.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { kustomizeFiles } from '../manifests/render.ts';

const CONFIG_DIR = fileURLToPath(new URL('.', import.meta.url));

describe('generated files', () => {
  const schemas = generateSchemas();

  it('config/schemas.generated.json matches apis/ (run `npm run generate` after changing apis/)', () => {
    expect(readFileSync(SCHEMAS_FILE, 'utf8')).toBe(schemasFileText(schemas));
  });

  it.each(['crds', 'concierge', 'agent'] as const)(
    'config/%s matches the renderer (run `npm run generate`)',
    (component) => {
      for (const [file, text] of kustomizeFiles(component, DEFAULT_INSTALL, schemas)) {
        expect(`${file}:\n${readFileSync(join(CONFIG_DIR, component, file), 'utf8')}`).toBe(
          `${file}:\n${text}`,
        );
      }
    },
  );

  it.each(CHARTS)('config/charts/%s matches the renderer (run `npm run generate`)', (chart) => {
    const files = chartFiles(chart, schemas);
    const committed = readdirSync(join(CHARTS_DIR, chart), { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => join(e.parentPath, e.name).slice(join(CHARTS_DIR, chart).length + 1))
      .sort();
    expect(committed).toEqual([...files.keys()].sort());
    for (const [file, text] of files)
      expect(`${file}:\n${readFileSync(join(CHARTS_DIR, chart, file), 'utf8')}`).toBe(`${file}:\n${text}`);
  });

  it('carries the JSDoc of apis/ as descriptions and the tags as validation', () => {
    const spec = schemas.JWTAuthenticator.spec as {
      required?: string[];
      properties: Record<string, Record<string, unknown>>;
      'x-kubernetes-validations'?: { rule: string }[];
    };
    // issuer and audience, or jwt: a validation rule, since a schema's required cannot say either-or.
    expect(spec.required).toBeUndefined();
    expect(spec['x-kubernetes-validations']).toEqual([
      expect.objectContaining({ rule: expect.stringContaining('has(self.jwt)') as unknown }),
    ]);
    expect(spec.properties['issuer']).toMatchObject({ type: 'string', pattern: '^https://[^?#]+$' });
    expect(spec.properties['issuer']?.['description']).toMatch(/must use https/);
    const status = schemas.JWTAuthenticator.status as { properties: Record<string, Record<string, unknown>> };
    expect(status.properties['conditions']).toMatchObject({
      'x-kubernetes-list-type': 'map',
      'x-kubernetes-list-map-keys': ['type'],
    });
    expect(JSON.stringify(schemas)).not.toMatch(/"\$schema"|"const"|"listType"/);
  });
});
