import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';

/** What each folder must not import: imports flow apis ← lib ← controllers ← concierge, apis ← lib ← agent, cli on top. */
const forbidden = {
  apis: ['lib', 'controllers', 'concierge', 'agent', 'manifests', 'cli'],
  lib: ['controllers', 'concierge', 'agent', 'manifests', 'cli'],
  controllers: ['concierge', 'agent', 'manifests', 'cli'],
  concierge: ['agent', 'manifests', 'cli'],
  agent: ['controllers', 'concierge', 'manifests', 'cli'],
  manifests: ['cli'],
};
/** What ships: it never imports the development environment, the tests or the benchmarks. */
const product = ['apis', 'lib', 'controllers', 'concierge', 'agent', 'manifests', 'cli'];

const zones = [
  ...Object.entries(forbidden).map(([target, from]) => ({
    target: `./${target}`,
    from: from.map((f) => `./${f}`),
    message: `${target}/ may not import this layer (see STYLE.md, "Layout and boundaries").`,
  })),
  // Nothing imports bench/, and the development environment (dev/) stands without the tests.
  ...[...product, 'dev', 'integration'].map((target) => ({ target: `./${target}`, from: './bench' })),
  {
    target: './dev',
    from: './integration',
    message: 'dev/ is the development environment; it never imports tests.',
  },
  {
    target: './bench',
    from: './integration',
    message: 'bench/ starts clusters with dev/, not with the tests.',
  },
];

/** Product code never imports dev/, integration/ or the tests' fakes (test-support/); the fakes import no test. */
const productionZones = [
  ...zones,
  ...product.map((target) => ({
    target: `./${target}`,
    from: ['./dev', './integration', './test-support'],
    message:
      'Shipped code never imports the development environment (dev/), the tests (integration/) or their fakes (test-support/).',
  })),
  ...['dev', 'bench'].map((target) => ({ target: `./${target}`, from: './test-support' })),
  { target: './test-support', from: ['./integration', './dev', './bench'] },
];

/**
 * Server code waits on the injected clock (lib/clock.ts), which tests move by hand, and its scheduled work runs under
 * the controller manager (lib/controller/periodic.ts), which starts and stops it with the process.
 */
const clockOnly =
  'Server code takes time from an injected Clock (lib/clock.ts); scheduled work is a periodic() controller.';
const server = ['apis', 'lib', 'controllers', 'concierge', 'agent', 'manifests'];
const kubeClientOnly = {
  name: '@kubernetes/client-node',
  message: 'Only lib/kube/kube.ts imports client-node (ESM-only); depend on its small interfaces instead.',
};

/** Unit tests may use dev/ (real servers, the local OIDC issuer), never integration/. */
const testZones = [...zones, ...product.map((target) => ({ target: `./${target}`, from: './integration' }))];

export default tseslint.config(
  { ignores: ['node_modules/', '.cache/', '.sealion/', 'coverage/', 'dist/'] },
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
          paths: [kubeClientOnly],
        },
      ],
    },
  },
  {
    files: server.map((folder) => `${folder}/**/*.ts`),
    ignores: ['lib/clock.ts', 'lib/controller/**', '**/*.test.ts'],
    rules: {
      'no-restricted-globals': [
        'error',
        { name: 'setTimeout', message: clockOnly },
        { name: 'setInterval', message: clockOnly },
      ],
      'no-restricted-imports': [
        'error',
        {
          paths: [
            kubeClientOnly,
            { name: 'node:timers', message: clockOnly },
            { name: 'node:timers/promises', message: clockOnly },
          ],
        },
      ],
    },
  },
  {
    files: ['lib/kube/kube.ts'],
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
