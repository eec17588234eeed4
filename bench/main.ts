// `npm run bench -- <suite>`: benchmarks that put Sealion next to its baselines in one run.
import { benchAuth } from './auth.ts';
import { benchPeering } from './peering.ts';
import { benchProxy } from './proxy.ts';
import { benchReach } from './reach.ts';
import { benchSsh } from './ssh.ts';
import { benchStartup } from './startup.ts';
import { benchTunnel } from './tunnel.ts';
import type { Verdict } from './targets.ts';

/** Each suite; those that judge their targets return the run's verdict. */
const suites: Record<string, () => Promise<Verdict | void>> = {
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
// A suite whose targets are not all met, or not all measured, fails the run once every suite has run: a script
// that reads the exit status never takes a run that judged too little for one that met its targets.
for (const name of wanted.length > 0 ? wanted : Object.keys(suites)) {
  const verdict = await suites[name]!();
  if (verdict !== undefined && verdict !== 'met') process.exitCode = 1;
}
