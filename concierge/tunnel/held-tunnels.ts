// The tunnels this replica holds, one per cluster: each is bound to the certificate it was opened with, and closes
// when the Cluster registry stops matching that binding, when the certificate expires, or when a newer tunnel of the
// same cluster takes its place. Every arrival and departure is announced (onTunnelChange), not polled.
import type { Duplex } from 'node:stream';
import type { AgentBinding } from '../../apis/agent-binding.ts';
import type { Cluster } from '../../apis/tunnel.ts';
import type { Clock } from '../../lib/clock.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import type { Logger } from '../../lib/log.ts';
import { newTunnelClient, type TunnelClient } from '../../lib/tunnel/tunnel.ts';
import { bindingProblem } from './binding.ts';
import type { HeldTunnel } from './cluster-status.ts';
import { newTunnelRoute, tunnelLimits, type TunnelRoute } from './route.ts';

/** What the agent said of itself when it dialed, and when its certificate expires. */
export type AgentReport = Omit<HeldTunnel, 'connectedSince' | 'transport'>;

export interface HeldTunnelsOptions {
  clusters: Informer<Cluster>;
  /** This replica's tunnel to `cluster` came or went. */
  onTunnelChange(cluster: string): void;
  budget?: MemoryBudget;
  clock: Clock;
  log: Logger;
}

interface Connected {
  /** What the tunnel's certificate is bound to; the tunnel closes when the registry stops matching it. */
  binding: AgentBinding;
  tunnel: TunnelClient;
  route: TunnelRoute;
  held: HeldTunnel;
  /** Set once its agent was asked to move (handOver) or said it leaves: no new request takes it. */
  moving?: boolean;
}

/**
 * How long a handover waits for the agents to move before it returns: an agent of 2.1 dials another replica within
 * seconds of being asked, and its tunnel here closes once the streams in flight end. Streams that outlast this
 * (watches, exec sessions) are not cut by the handover: the drain's later steps end them, and the stop closes what is
 * left. Longer would hold up those steps behind streams only they end; shorter would cut nothing either, but return
 * before most agents of 2.0 (which move once their streams end) have gone.
 */
export const HANDOVER_BOUND_MS = 10_000;
/**
 * The longest a replaced tunnel serves its streams in flight (retire): an agent's old pod drains for 20 s
 * (AGENT_DRAIN_SECONDS) once its new one is ready, so 30 s lets plain requests finish in any rollout, and cuts only
 * long streams (a watch then resumes through the new tunnel).
 */
export const RETIRED_BOUND_MS = 30_000;

/** The longest delay a Node timer takes (about 24.8 days); agent certificates live longer. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Calls `fire` at `when` (epoch ms, as `clock` tells it), however far off that is. */
function atTime(clock: Clock, when: number, fire: () => void): { cancel(): void } {
  let timer: unknown;
  const arm = (): void => {
    const left = when - clock.now();
    if (left <= 0) return fire();
    timer = clock.setTimeout(arm, Math.min(left, MAX_TIMER_MS));
  };
  arm();
  return { cancel: () => clock.clearTimeout(timer) };
}

export class HeldTunnels {
  /** Invariant: one entry per cluster, the newest tunnel; an entry leaves when its tunnel has closed. */
  private readonly connected = new Map<string, Connected>();
  private readonly opts: HeldTunnelsOptions;
  /**
   * Tunnels replaced by a newer one of their cluster, carrying their streams in flight to the end (retire): closed at
   * RETIRED_BOUND_MS at the latest, and by closeAll or when their cluster's binding changes, as held ones are.
   */
  private readonly retired = new Map<TunnelClient, string>();
  /** Set by handOver: a tunnel that comes up after it is dropped (its dial raced the listener's refusal). */
  private handingOver = false;

  constructor(opts: HeldTunnelsOptions) {
    this.opts = opts;
  }

  /** The route through `cluster`'s tunnel, none while it moves: the agent takes no new stream on it then. */
  route(cluster: string): TunnelRoute | undefined {
    const entry = this.connected.get(cluster);
    return entry && !entry.moving ? entry.route : undefined;
  }

  /** The tunnel this replica holds for `cluster`, none while it moves: peers then send its requests elsewhere. */
  held(cluster: string): HeldTunnel | undefined {
    const entry = this.connected.get(cluster);
    return entry && !entry.moving ? entry.held : undefined;
  }

  /**
   * Makes `stream` the tunnel of the cluster `binding` names, in place of any it had; calls `drop` to end the
   * connection instead when the registry no longer matches the binding.
   */
  accept(
    binding: AgentBinding,
    stream: Duplex,
    transport: HeldTunnel['transport'],
    report: AgentReport,
    drop: () => void,
  ): void {
    const { clock, log } = this.opts;
    const cluster = binding.cluster;
    // The registry may have changed while the upgrade completed. From this check until the tunnel is in
    // `connected` nothing yields, so any later change reaches it through registryChanged().
    const registered = this.opts.clusters.get(cluster);
    const changed = bindingProblem(binding, registered);
    if (!registered || changed) {
      log.warn({ problem: changed }, 'tunnel refused');
      return drop();
    }
    if (this.handingOver) {
      log.info({ cluster }, 'tunnel refused: this replica is draining');
      return drop();
    }
    const limits = tunnelLimits(registered.spec ?? {});
    const tunnel = newTunnelClient(stream, { maxStreams: limits.capacity });
    const previous = this.connected.get(cluster);
    const entry: Connected = {
      binding,
      tunnel,
      route: newTunnelRoute(cluster, tunnel, {
        limits,
        ...(this.opts.budget ? { budget: this.opts.budget } : {}),
      }),
      held: { connectedSince: new Date(clock.now()).toISOString(), transport, ...report },
    };
    this.connected.set(cluster, entry);
    // The tunnel it replaces (the agent's new pod dialed here while its old one runs, or the agent dialed again
    // after losing it) carries its streams in flight to their end, and takes no new one.
    if (previous) this.retire(cluster, previous.tunnel);
    log.info({ cluster, agentVersion: report.agentVersion, transport }, 'agent connected');
    this.closeAtExpiry(cluster, entry);
    this.whenLeaving(cluster, entry);
    this.opts.onTunnelChange(cluster);
  }

  /**
   * Takes a replaced tunnel out of service: no new stream; it closes once its streams in flight end, or at
   * RETIRED_BOUND_MS, whichever comes first. Its agent (the old pod of a rollout, or one that dialed again) stops
   * within that, and a watch cut then resumes elsewhere; without the bound, an agent that dials again and again would
   * pile up tunnels held open by long streams.
   */
  private retire(cluster: string, tunnel: TunnelClient): void {
    const { clock } = this.opts;
    this.retired.set(tunnel, cluster);
    tunnel.retire();
    const bound = clock.setTimeout(() => tunnel.close(), RETIRED_BOUND_MS);
    void tunnel.closed.then(() => {
      clock.clearTimeout(bound);
      this.retired.delete(tunnel);
    });
  }

  /**
   * An agent that stops says so on its tunnel (TunnelServer's leave): from then on the tunnel takes no new request
   * here, and this replica no longer says it holds the cluster, so that peers send its requests to another holder;
   * the streams in flight finish, and the tunnel closes after them.
   */
  private whenLeaving(cluster: string, entry: Connected): void {
    void entry.tunnel.leaving.then(() => {
      if (this.connected.get(cluster) !== entry || entry.moving) return;
      entry.moving = true;
      this.opts.log.info({ cluster }, 'agent leaving: its tunnel takes no new request');
      this.opts.onTunnelChange(cluster);
    });
  }

  /**
   * TLS checked the certificate once, at the handshake; the tunnel must not outlive it. The agent renews its
   * certificate long before, and dials again with the new one when this tunnel closes. The tunnel's end is
   * announced, not polled: the status changes the moment it closes.
   */
  private closeAtExpiry(cluster: string, entry: Connected): void {
    const { log } = this.opts;
    const { certificateExpiry } = entry.held;
    const expiry = atTime(this.opts.clock, new Date(certificateExpiry).getTime(), () => {
      log.info({ cluster, certificateExpiry }, 'tunnel closed: the certificate it was opened with expired');
      entry.tunnel.close();
    });
    void entry.tunnel.closed.then(() => {
      expiry.cancel();
      if (this.connected.get(cluster) !== entry) return;
      this.connected.delete(cluster);
      log.info({ cluster }, 'agent disconnected');
      this.opts.onTunnelChange(cluster);
    });
  }

  /**
   * A Cluster removed from the registry, created again, or with its agentGeneration raised loses its tunnel at
   * once, not at the agent's next reconnect; an edited one has its limits applied to the open tunnel.
   */
  registryChanged(cluster: string): void {
    const entry = this.connected.get(cluster);
    if (!entry) return;
    const problem = bindingProblem(entry.binding, this.opts.clusters.get(cluster));
    if (problem) {
      this.opts.log.info(
        { cluster, problem },
        'tunnel closed: its certificate no longer matches the Cluster',
      );
      entry.tunnel.close();
      for (const [tunnel, of] of this.retired) if (of === cluster) tunnel.close();
    }
    const current = this.opts.clusters.get(cluster);
    if (current) this.connected.get(cluster)?.route.configure(tunnelLimits(current.spec ?? {}));
  }

  /**
   * Asks every agent to move to another replica (TunnelClient's goAway): the streams in flight go on, no new one
   * starts here, and each tunnel closes once its streams end. Resolves when every tunnel has closed or `boundMs` (on
   * the clock) has passed, whichever comes first; it closes nothing itself. Returns how many tunnels it asked.
   */
  async handOver(boundMs = HANDOVER_BOUND_MS): Promise<number> {
    const { clock, log } = this.opts;
    this.handingOver = true;
    const entries = [...this.connected.values()].filter((e) => !e.moving);
    for (const entry of entries) {
      entry.moving = true;
      entry.tunnel.goAway();
    }
    log.info({ tunnels: entries.length }, 'asked the agents to move their tunnels to another replica');
    let timer: unknown;
    const bound = new Promise<'bound'>((done) => (timer = clock.setTimeout(() => done('bound'), boundMs)));
    const moved = Promise.all(entries.map((e) => e.tunnel.closed)).then(() => 'moved' as const);
    const outcome = await Promise.race([moved, bound]);
    clock.clearTimeout(timer);
    const left = [...this.connected.values()].filter((e) => e.moving).length;
    log.info({ tunnels: entries.length, left, outcome }, 'tunnels handed over');
    return entries.length;
  }

  closeAll(): void {
    for (const entry of this.connected.values()) entry.tunnel.close();
    this.connected.clear();
    for (const tunnel of this.retired.keys()) tunnel.close();
  }
}
