import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';

const layers = ['apis', 'lib', 'controllers', 'concierge', 'agent', 'cli', 'integration', 'bench'];

/** What each folder must not import: imports flow apis ← lib ← controllers ← concierge, apis ← lib ← agent, cli on top. */
const forbidden = {
  apis: ['lib', 'controllers', 'concierge', 'agent', 'cli'],
  lib: ['controllers', 'concierge', 'agent', 'cli'],
  controllers: ['concierge', 'agent', 'cli'],
  concierge: ['agent', 'cli'],
  agent: ['controllers', 'concierge', 'cli'],
};

const zones = [
  ...Object.entries(forbidden).map(([target, from]) => ({
    target: `./${target}`,
    from: from.map((f) => `./${f}`),
    message: `${target}/ may not import this layer (see STYLE.md, "Layout and boundaries").`,
  })),
  // Nothing imports bench/; only the cluster harness of integration/ is reusable (by `sealion dev` and bench/).
  ...layers.filter((l) => l !== 'bench').map((target) => ({ target: `./${target}`, from: './bench' })),
];

/** Production code never reaches into integration/, except cli/ and bench/, which start clusters with its harness. */
const productionZones = [
  ...zones,
  ...['apis', 'lib', 'controllers', 'concierge', 'agent'].map((target) => ({
    target: `./${target}`,
    from: './integration',
  })),
  { target: './cli', from: './integration', except: ['./harness'] },
  { target: './bench', from: './integration', except: ['./harness'] },
];

/** Tests anywhere may use the harness (real servers, the local OIDC issuer), but never other tests. */
const testZones = [
  ...zones,
  ...['apis', 'lib', 'controllers', 'concierge', 'agent', 'cli', 'bench'].map((target) => ({
    target: `./${target}`,
    from: './integration',
    except: ['./harness'],
  })),
];

export default tseslint.config(
  { ignores: ['node_modules/', '.cache/', '.sealion/', 'coverage/'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        projectService: { allowDefaultProject: ['*.js', 'bin/*.js'] },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    plugins: { 'import-x': importX },
    rules: {
      'import-x/no-restricted-paths': ['error', { zones: productionZones }],
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      'no-restricted-imports': [
        'error',
        {
          paths: [
            {
              name: '@kubernetes/client-node',
              message:
                'Only lib/kube.ts imports client-node (ESM-only); depend on its small interfaces instead.',
            },
          ],
        },
      ],
    },
  },
  {
    files: ['lib/kube.ts', 'lib/kube/**'],
    rules: { 'no-restricted-imports': 'off' },
  },
  {
    files: ['**/*.test.ts'],
    rules: {
      '@typescript-eslint/unbound-method': 'off',
      // Fakes implement async interfaces without awaiting anything.
      '@typescript-eslint/require-await': 'off',
      'import-x/no-restricted-paths': ['error', { zones: testZones }],
    },
  },
  {
    files: ['**/*.js'],
    ...tseslint.configs.disableTypeChecked,
  },
);
