import { describe, expect, it } from '@jest/globals';
import { parse as parseYaml } from 'yaml';
import { HttpsError } from '../lib/https-client.ts';
import { SEALION_VERSION } from '../lib/version.ts';
import {
  clientVersion,
  failureText,
  hubBase,
  parseAgents,
  parseConciergeVersions,
  skewWarnings,
  STALE_AFTER_MS,
  versionOutput,
  versionText,
  type ClientVersion,
  type VersionReport,
} from './version.ts';

const CLIENT: ClientVersion = {
  version: '0.1.0',
  gitCommit: 'a'.repeat(40),
  gitTreeState: 'clean',
  nodeVersion: 'v24.21.0',
  platform: 'linux/x64',
  standalone: false,
  tunnelProtocol: '2.1 (2.0 to 2.2)',
};
const NOW = Date.parse('2026-01-01T00:10:00Z');
const JUST_NOW = '2026-01-01T00:09:30Z';

const status = (code: number, message: string): HttpsError => {
  const err = new HttpsError('BadStatus', `HTTP ${code}`, code);
  err.body = JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', message, code });
  return err;
};

describe('clientVersion', () => {
  it('says the package version, the Node and the platform, and asks git in the checkout', async () => {
    const v = await clientVersion();
    expect(v).toMatchObject({
      version: SEALION_VERSION,
      nodeVersion: process.version,
      platform: `${process.platform}/${process.arch}`,
      standalone: false,
    });
    // The tests run in a checkout; without git the build is unknown, never made up.
    if (v.gitCommit) expect(v.gitTreeState).toMatch(/^(clean|dirty)$/);
    else expect(v.gitTreeState).toBe('unknown');
  });
});

describe('failureText', () => {
  it.each([
    [
      status(403, 'configmaps "x" is forbidden: User "u" cannot get'),
      'forbidden: configmaps "x" is forbidden: User "u" cannot get',
    ],
    [
      status(404, 'the server could not find the requested resource'),
      'not found: the server could not find the requested resource',
    ],
    [status(401, 'Unauthorized'), 'unauthorized: Unauthorized'],
    [status(503, 'cluster edge has no agent connected'), 'unavailable: cluster edge has no agent connected'],
    [new HttpsError('BadStatus', 'HTTP 500', 500), 'HTTP 500'],
    [new HttpsError('Timeout', 'timed out'), 'no answer in time'],
    [
      new HttpsError('Network', 'connect ECONNREFUSED 127.0.0.1:1'),
      'unreachable: connect ECONNREFUSED 127.0.0.1:1',
    ],
    // Server text cannot rewrite the terminal.
    [status(403, 'no\u001b[2J'), 'forbidden: no\\u001b[2J'],
  ])('words case %#', (err, want) => {
    expect(failureText(err)).toBe(want);
  });
});

describe('hubBase', () => {
  it.each([
    ['https://proxy.example.com/', 'https://proxy.example.com/'],
    ['https://proxy.example.com/clusters/edge/', 'https://proxy.example.com/'],
    ['https://proxy.example.com:8443/clusters/edge', 'https://proxy.example.com:8443/'],
    ['https://lb.example.com/sealion/clusters/edge/', 'https://lb.example.com/sealion/'],
    ['https://api.example.com:6443/', 'https://api.example.com:6443/'],
  ])('%s', (base, want) => {
    expect(hubBase(base)).toBe(want);
  });
});

describe('parseConciergeVersions', () => {
  const cm = (data?: Record<string, string>): unknown => ({ kind: 'ConfigMap', ...(data ? { data } : {}) });
  it('reads the list and when it was confirmed', () => {
    expect(
      parseConciergeVersions(
        cm({
          versions: '[{"version":"0.2.0","replicas":1},{"version":"0.1.0","replicas":1}]',
          observedAt: JUST_NOW,
        }),
      ),
    ).toEqual({
      versions: [
        { version: '0.2.0', replicas: 1 },
        { version: '0.1.0', replicas: 1 },
      ],
      observedAt: JUST_NOW,
    });
  });
  it('keeps the tunnel protocol each version says it serves, and drops one that is no string', () => {
    expect(
      parseConciergeVersions(
        cm({
          versions:
            '[{"version":"0.2.0","replicas":1,"tunnelProtocol":"2.2"},{"version":"0.1.0","replicas":1,"tunnelProtocol":2}]',
        }),
      ).versions,
    ).toEqual([
      { version: '0.2.0', replicas: 1, tunnelProtocol: '2.2' },
      { version: '0.1.0', replicas: 1 },
    ]);
  });
  it.each([
    [cm(), /not published yet/],
    [cm({ versions: '{' }), /not JSON/],
    [cm({ versions: '[{"version":1,"replicas":1}]' }), /not a list/],
    [cm({ versions: '{"version":"0.1.0"}' }), /not a list/],
    [null, /not published yet/],
  ])('refuses %j', (configMap, want) => {
    expect(() => parseConciergeVersions(configMap)).toThrow(want);
  });
});

describe('parseAgents', () => {
  it('takes each cluster name, its agent version and whether it is connected', () => {
    expect(
      parseAgents({
        items: [
          { metadata: { name: 'edge' }, status: { agentVersion: '0.1.0', connected: true } },
          { metadata: { name: 'far' }, status: { agentVersion: '0.0.9', connected: false } },
          { metadata: { name: 'new' } },
        ],
      }),
    ).toEqual({
      edge: { version: '0.1.0', connected: true },
      far: { version: '0.0.9', connected: false },
      new: { version: '', connected: false },
    });
  });
  it('refuses what is no list', () => {
    expect(() => parseAgents({ kind: 'Status' })).toThrow(/not a list/);
  });
  it('says which agents the concierge refused for their tunnel protocol, and why, from their condition', () => {
    const condition = (status: string, message: string) => ({
      type: 'AgentProtocolSupported',
      status,
      reason: 'r',
      message,
      lastTransitionTime: JUST_NOW,
    });
    const why =
      'the agent speaks tunnel protocol 3.0 and the hub 2.1, which serves agents of 2.0 to 2.2: upgrade the hub';
    const agents = parseAgents({
      items: [
        { metadata: { name: 'old' }, status: { connected: false, conditions: [condition('False', why)] } },
        {
          metadata: { name: 'upgraded' },
          status: { connected: true, conditions: [condition('True', 'served')] },
        },
        { metadata: { name: 'odd' }, status: { conditions: 'not a list' } },
      ],
    });
    expect(agents).toEqual({
      old: { version: '', connected: false, protocolRefused: why },
      upgraded: { version: '', connected: true },
      odd: { version: '', connected: false },
    });
    expect(versionText({ clientVersion: CLIENT, serverVersion: {}, agents }, NOW)).toContain(
      `  old: unknown (not connected) (refused, outside the tunnel protocol's skew policy: ${why})\n`,
    );
  });
});

describe('skewWarnings', () => {
  const ours = { major: 2, minor: 1 };
  it('says nothing of concierges within the policy, or of those that state no protocol', () => {
    expect(
      skewWarnings(
        [
          { version: '0.2.0', replicas: 1, tunnelProtocol: '2.2' },
          { version: '0.1.0', replicas: 1, tunnelProtocol: '2.0' },
          { version: '0.0.9', replicas: 1 },
          { version: '0.0.8', replicas: 1, tunnelProtocol: 'junk' },
        ],
        ours,
      ),
    ).toEqual([]);
  });
  it('says which end to upgrade for a concierge outside it, either way', () => {
    expect(
      skewWarnings(
        [
          { version: '0.4.0', replicas: 2, tunnelProtocol: '2.3' },
          { version: '9.0.0', replicas: 1, tunnelProtocol: '3.0' },
          { version: '0.0.1', replicas: 1, tunnelProtocol: '1.9' },
        ],
        ours,
      ),
    ).toEqual([
      "this CLI's release speaks tunnel protocol 2.1 and concierge 0.4.0 serves agents of 2.2 to 2.4: agents this CLI installs would be refused; use a CLI of the concierge's release",
      "this CLI's release speaks tunnel protocol 2.1 and concierge 9.0.0 serves agents of 3.0 to 3.1: agents this CLI installs would be refused; use a CLI of the concierge's release",
      "this CLI's release speaks tunnel protocol 2.1 and concierge 0.0.1 serves agents of 1.8 to 1.10: agents this CLI installs would be refused; upgrade the concierge first",
    ]);
  });
});

describe('versionText', () => {
  it('prints only the client with --client', () => {
    expect(versionText({ clientVersion: { ...CLIENT, gitTreeState: 'dirty', standalone: true } }, NOW)).toBe(
      `Client Version: 0.1.0
Client Build: ${'a'.repeat(40)} (dirty)
Node Version: v24.21.0
Platform: linux/x64 (standalone executable)
Tunnel Protocol: 2.1 (2.0 to 2.2)
`,
    );
  });

  it('prints every part, two concierge versions during a rolling upgrade, and agents by name', () => {
    const report: VersionReport = {
      clientVersion: { ...CLIENT, gitCommit: undefined, gitTreeState: 'unknown' },
      serverVersion: { major: '1', minor: '36', gitVersion: 'v1.36.3' },
      conciergeVersions: [
        { version: '0.2.0', replicas: 2, tunnelProtocol: '2.3' },
        { version: '0.1.0', replicas: 1 },
      ],
      conciergeVersionsObservedAt: JUST_NOW,
      skew: ['this CLI is old'],
      agents: {
        far: { version: '0.0.9', connected: false },
        edge: { version: '0.1.0', connected: true },
        fresh: { version: '', connected: false },
      },
    };
    expect(versionText(report, NOW)).toBe(`Client Version: 0.1.0
Client Build: unknown
Node Version: v24.21.0
Platform: linux/x64
Tunnel Protocol: 2.1 (2.0 to 2.2)
Server Version: v1.36.3
Concierge Version: 0.2.0 (2 replicas, tunnel protocol 2.3), 0.1.0 (1 replica)
Agent Versions:
  edge: 0.1.0
  far: 0.0.9 (not connected)
  fresh: unknown (not connected)
Warning: this CLI is old
`);
  });

  it('says what it could not read, and why, and prints the rest', () => {
    const text = versionText(
      {
        clientVersion: CLIENT,
        serverVersion: { gitVersion: 'v1.36.3' },
        errors: {
          conciergeVersions: 'forbidden: configmaps "sealion-concierge-versions" is forbidden',
          agents: 'no answer in time',
        },
      },
      NOW,
    );
    expect(text).toContain('Server Version: v1.36.3\n');
    expect(text).toContain(
      'Concierge Version: unknown (forbidden: configmaps "sealion-concierge-versions" is forbidden)\n',
    );
    expect(text).toContain('Agent Versions: unknown (no answer in time)\n');
  });

  it('calls a list nobody confirmed lately stale, and an empty agent list none; leaves the failed server out', () => {
    const text = versionText(
      {
        clientVersion: CLIENT,
        errors: { serverVersion: 'unreachable: connect ECONNREFUSED' },
        conciergeVersions: [{ version: '0.1.0', replicas: 2 }],
        conciergeVersionsObservedAt: new Date(NOW - STALE_AFTER_MS - 3_600_000).toISOString(),
        agents: {},
      },
      NOW,
    );
    // The command says why on standard error and fails, as kubectl version does.
    expect(text).not.toContain('Server Version');
    expect(text).toContain(
      'Concierge Version: 0.1.0 (2 replicas) (not confirmed for 65m: the concierge may not be running)\n',
    );
    expect(text).toContain('Agent Versions: none (no agent-backed clusters)\n');
  });

  it('escapes what servers say', () => {
    const text = versionText(
      {
        clientVersion: CLIENT,
        serverVersion: { gitVersion: 'v1\u001b]0;owned\u0007' },
        conciergeVersions: [{ version: '\u202e1.0', replicas: 1 }],
        conciergeVersionsObservedAt: JUST_NOW,
        agents: { 'edge\r': { version: 'x\u001b[2J', connected: true } },
      },
      NOW,
    );
    // eslint-disable-next-line no-control-regex -- finding control characters is the point
    expect(text).not.toMatch(/[\u001b\u0007\u202e\r]/);
    expect(text).toContain('Server Version: v1\\u001b]0;owned\\u0007\n');
  });
  it('says a reason every part shares once, not once a part', () => {
    const why = 'unreachable: connection refused';
    const text = versionText(
      { clientVersion: CLIENT, errors: { serverVersion: why, conciergeVersions: why, agents: why } },
      NOW,
    );
    expect(text).toBe(versionText({ clientVersion: CLIENT }, NOW));
    expect(
      versionText(
        {
          clientVersion: CLIENT,
          errors: { serverVersion: why, conciergeVersions: 'forbidden', agents: why },
        },
        NOW,
      ),
    ).toContain('Concierge Version: unknown (forbidden)\n');
  });
});

describe('versionOutput', () => {
  const report: VersionReport = {
    clientVersion: CLIENT,
    serverVersion: { gitVersion: 'v1.36.3' },
    conciergeVersions: [{ version: '0.1.0', replicas: 2 }],
    conciergeVersionsObservedAt: JUST_NOW,
    agents: { edge: { version: '0.1.0', connected: true } },
  };
  it('writes JSON and YAML in kubectl version’s shape, with Sealion’s parts', async () => {
    expect(JSON.parse(await versionOutput(report, 'json'))).toEqual(report);
    expect(parseYaml(await versionOutput(report, 'yaml'))).toEqual(report);
  });
  it('keeps YAML free of control characters', async () => {
    const yaml = await versionOutput(
      { ...report, agents: { e: { version: 'x\u009b2J', connected: true } } },
      'yaml',
    );
    expect(yaml).not.toMatch(/[\u009b]/);
  });
});
