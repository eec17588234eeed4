// `npm run bench -- <suite>`: benchmarks that put Sealion next to its baselines in one run.
import { benchAuth } from './auth.ts';
import { benchPeering } from './peering.ts';
import { benchProxy } from './proxy.ts';
import { benchReach } from './reach.ts';
import { benchSsh } from './ssh.ts';
import { benchStartup } from './startup.ts';
import { benchTunnel } from './tunnel.ts';

const suites: Record<string, () => Promise<void>> = {
  auth: benchAuth,
  proxy: benchProxy,
  tunnel: benchTunnel,
  peering: benchPeering,
  reach: benchReach,
  ssh: benchSsh,
  startup: benchStartup,
};
/** Other names for a suite. */
const aliases: Record<string, string> = { authn: 'auth' };
const wanted = process.argv.slice(2).map((s) => aliases[s] ?? s);
const unknown = wanted.filter((s) => !(s in suites));
if (unknown.length > 0) {
  console.error(`unknown suite ${unknown.join(', ')}; suites: ${Object.keys(suites).join(', ')}`);
  process.exit(2);
}
for (const name of wanted.length > 0 ? wanted : Object.keys(suites)) await suites[name]!();
