// Simulated agents for the tunnel benchmark, in a process of their own (several share the load, as real agents run
// on machines of their own): each is the agent's own code (newAgent: its dialing, transport and backoff) with a
// certificate of its own. Reads one JSON line {hub, caPem, agents: [{name, certPem, keyPem}], tunnels?}, then answers each
// "count" line with how many are connected. Exits on SIGTERM and when its input closes (the benchmark is gone).
import { createInterface } from 'node:readline';
import { newAgent, type Agent } from '../agent/agent.ts';
import { silentLogger } from '../lib/log.ts';

interface Setup {
  hub: string;
  caPem: string;
  agents: { name: string; certPem: string; keyPem: string }[];
  /** Tunnels each agent holds (the agent's default when absent). */
  tunnels?: number;
}

let agents: Agent[] = [];
const input = createInterface({ input: process.stdin });
input.once('close', () => process.exit(0));
input.on('line', (line) => {
  if (line === 'count') return void console.log(agents.filter((a) => a.connected()).length);
  const setup = JSON.parse(line) as Setup;
  agents = setup.agents.map((cert) =>
    newAgent({
      cluster: cert.name,
      hub: new URL(setup.hub),
      trust: { caPem: setup.caPem },
      bootstrapToken: () => undefined,
      store: {
        load: () => Promise.resolve({ certPem: cert.certPem, keyPem: cert.keyPem, caPem: setup.caPem }),
        save: () => Promise.resolve(),
      },
      // Never reached: the benchmark sends nothing through these tunnels.
      upstream: { url: new URL('https://127.0.0.1:9') },
      version: 'bench',
      log: silentLogger(),
      ...(setup.tunnels ? { tunnels: setup.tunnels } : {}),
    }),
  );
  // An agent's start only sets its dialing off; the count answers say when they are connected.
  void Promise.all(agents.map((agent) => agent.start()));
});
process.once('SIGTERM', () => process.exit(0));
