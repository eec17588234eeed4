// `npm run generate`: turns the types in apis/ into the CRDs' OpenAPI schemas (config/schemas.generated.json)
// and renders the default install manifests into config/crds, config/concierge and config/agent.
// A unit test fails when a committed file differs from what this would write.
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createGenerator } from 'ts-json-schema-generator';
import { CRD_KINDS, type JSONSchema, type KindSchemas } from '../manifests/crds.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { writeKustomize } from '../manifests/render.ts';
import { chartFiles, CHARTS } from '../manifests/chart.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
export const SCHEMAS_FILE = fileURLToPath(new URL('schemas.generated.json', import.meta.url));

/** JSDoc tags (camelCase, as TypeScript parses them) that become Kubernetes schema extensions. */
const EXTENSION_TAGS: Record<string, (value: unknown) => [string, unknown]> = {
  listType: (v) => ['x-kubernetes-list-type', v],
  // `@validation <CEL rule> :: <message>`: a CRD validation rule the API server enforces on every write.
  validation: (v) => {
    const [rule, message] = String(v).split(' :: ');
    return [
      'x-kubernetes-validations',
      [{ rule: rule!.trim(), ...(message ? { message: message.trim() } : {}) }],
    ];
  },
  listMapKeys: (v) => [
    'x-kubernetes-list-map-keys',
    String(v)
      .split(',')
      .map((s) => s.trim()),
  ],
};

/** Rewrites draft-07 output into a Kubernetes structural schema: no $schema, no const, extensions renamed. */
function toStructural(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(toStructural);
  if (node === null || typeof node !== 'object') return node;
  const out: JSONSchema = {};
  for (const [key, value] of Object.entries(node as JSONSchema)) {
    if (key === '$schema') continue;
    if (key === 'const') out['enum'] = [value];
    else if (EXTENSION_TAGS[key]) {
      const [name, converted] = EXTENSION_TAGS[key](value);
      out[name] = converted;
    } else out[key] = toStructural(value);
  }
  return out;
}

export function generateSchemas(): KindSchemas {
  const generator = createGenerator({
    path: `${ROOT}apis/index.ts`,
    tsconfig: `${ROOT}tsconfig.json`,
    expose: 'none',
    topRef: false,
    jsDoc: 'extended',
    extraTags: Object.keys(EXTENSION_TAGS),
    skipTypeCheck: true,
    additionalProperties: true,
  });
  const result = {} as KindSchemas;
  for (const kind of CRD_KINDS) {
    const schema = toStructural(generator.createSchema(kind)) as {
      description?: string;
      properties: { spec: JSONSchema; status: JSONSchema };
    };
    result[kind] = {
      description: schema.description ?? kind,
      spec: schema.properties.spec,
      status: schema.properties.status,
    };
  }
  return result;
}

/** Where the Helm charts go: config/charts/<chart>/. */
export const CHARTS_DIR = fileURLToPath(new URL('charts', import.meta.url));

/** Writes the Helm charts afresh (a file the renderer no longer makes does not linger). */
export function writeCharts(dir: string, schemas: KindSchemas): void {
  for (const chart of CHARTS) {
    rmSync(join(dir, chart), { recursive: true, force: true });
    for (const [file, text] of chartFiles(chart, schemas)) {
      mkdirSync(dirname(join(dir, chart, file)), { recursive: true });
      writeFileSync(join(dir, chart, file), text);
    }
  }
}

export function schemasFileText(schemas: KindSchemas): string {
  return JSON.stringify(schemas, null, 2) + '\n';
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const schemas = generateSchemas();
  writeFileSync(SCHEMAS_FILE, schemasFileText(schemas));
  writeKustomize(`${ROOT}config`, DEFAULT_INSTALL, schemas);
  writeCharts(CHARTS_DIR, schemas);
  console.log(
    'wrote config/schemas.generated.json, config/crds, config/concierge, config/agent, config/charts/sealion-concierge, config/charts/sealion-agent',
  );
}
