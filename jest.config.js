// Jest runs in its ESM mode (node --experimental-vm-modules, see package.json) because
// @kubernetes/client-node 2.x and jose 6 ship only ES modules. @swc/jest strips the types.
const swc = [
  '@swc/jest',
  {
    // keepImportAttributes: JSON imports keep `with { type: 'json' }`, which Node's loader (and Jest's) require.
    jsc: { parser: { syntax: 'typescript' }, target: 'es2024', experimental: { keepImportAttributes: true } },
    module: { type: 'es6' },
    sourceMaps: 'inline',
  },
];

const common = {
  extensionsToTreatAsEsm: ['.ts'],
  transform: { '^.+\\.ts$': swc },
  moduleFileExtensions: ['ts', 'js', 'json'],
  testEnvironment: 'node',
};

/** @type {import('jest').Config} */
export default {
  // A run that open handles would keep alive is ended, loudly and with status 1, instead of holding CI.
  globalTeardown: '<rootDir>/integration/harness/exit-guard.ts',
  // A test's time unless it sets its own. `npm test` runs the unit tests beside the integration tests, on two shared
  // cores: one that relays 120 MiB over loopback in 0.4 s alone took over Jest's default 5 s there. A bound, not a
  // measure: a hung test still ends.
  testTimeout: 30_000,
  projects: [
    {
      ...common,
      displayName: 'unit',
      testMatch: ['<rootDir>/{apis,lib,controllers,concierge,agent,manifests,cli,config,bench}/**/*.test.ts'],
      // Node's, plus: an error nothing handled in the worker while the file runs fails the file, naming it.
      testEnvironment: '<rootDir>/integration/harness/process-errors-environment.ts',
    },
    {
      ...common,
      displayName: 'integration',
      testMatch: ['<rootDir>/integration/**/*.test.ts'],
      // Builds the pinned Kubernetes binaries once, with progress, before any test starts a cluster.
      globalSetup: '<rootDir>/integration/harness/global-setup.ts',
      setupFilesAfterEnv: ['<rootDir>/integration/harness/jest-setup.ts'],
      // Node's, plus a sweep after each file: no process a test started outlives its file.
      testEnvironment: '<rootDir>/integration/harness/environment.ts',
      slowTestThreshold: 60,
    },
  ],
};
