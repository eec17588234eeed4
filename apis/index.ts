export * from './groups.ts';
export type * from './meta.ts';
export * from './authentication.ts';
export type * from './config.ts';
export * from './login.ts';
export type * from './identity.ts';
export * from './tunnel.ts';
export * from './install.ts';
export * from './agent-binding.ts';
