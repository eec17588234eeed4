import { DEFAULT_CONFIG_YAML } from '../apis/install.ts';
import { describe, expect, it } from '@jest/globals';
import {
  ConfigError,
  MAX_CONFIG_BYTES,
  loadConfig,
  newConfigSource,
  parseDuration,
  type ConfigProblem,
} from './config.ts';
import { newCA } from '../lib/pki/pki.ts';

function problemsOf(text: string): ConfigProblem[] {
  try {
    loadConfig(text);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return [...(err as ConfigError).problems];
  }
  throw new Error('expected loadConfig to fail');
}

const caData = Buffer.from((await newCA('test')).certPem).toString('base64');

describe('loadConfig', () => {
  it('reads accessRequests and names each field it refuses', () => {
    const config = loadConfig(
      'accessRequests: {hubName: main, hub: {groups: [oncall], maxDurationSeconds: 7200, approvals: 2, requireReason: true}}',
    );
    expect(config.accessRequests).toEqual({
      hubName: 'main',
      hub: { groups: ['oncall'], maxDurationSeconds: 7200, approvals: 2, requireReason: true },
    });
    const problems = problemsOf(
      'accessRequests: {hubName: "Not A Label", hub: {groups: ["a\\nb"], maxDurationSeconds: 30, approvals: 0, extra: 1}}',
    );
    expect(problems.map((p) => p.path).sort()).toEqual([
      'accessRequests.hub.approvals',
      'accessRequests.hub.extra',
      'accessRequests.hub.groups.0',
      'accessRequests.hub.maxDurationSeconds',
      'accessRequests.hubName',
    ]);
  });

  it('fills every default from an empty file', () => {
    const defaults = {
      impersonationProxy: {
        mode: 'auto',
        endpoint: '',
        service: {
          type: 'LoadBalancer',
          annotations: {},
          loadBalancerIP: '',
          externalTrafficPolicy: 'Local',
        },
        tls: { certificateAuthorityData: '', secretName: '' },
      },
      kubeCertAgent: { mode: 'auto' },
      ssh: {
        mode: 'disabled',
        port: 22,
        hubName: 'hub',
        certificateAuthorities: [],
        groupsExtension: 'groups@sealion.dev',
        allowSystemNames: false,
        maxBindingLifetime: '12h',
      },
      accessRequests: {
        hubName: 'hub',
        hub: { groups: [], maxDurationSeconds: 3600, approvals: 1, requireReason: false },
      },
    };
    expect(loadConfig('')).toEqual(defaults);
    expect(loadConfig('# only a comment\n')).toEqual(defaults);
    expect(loadConfig('impersonationProxy: {}')).toEqual(defaults);
    // The shipped ConfigMap spells out exactly the defaults.
    expect(loadConfig(DEFAULT_CONFIG_YAML)).toEqual(defaults);
  });

  it('reads ssh.maxBindingLifetime as Go and kubectl write durations', () => {
    expect(loadConfig('ssh: {maxBindingLifetime: 1h30m}').ssh.maxBindingLifetime).toBe('1h30m');
    expect(parseDuration('12h')).toBe(12 * 3600_000);
    expect(parseDuration('1h30m')).toBe(90 * 60_000);
    expect(parseDuration('300s')).toBe(300_000);
    for (const bad of ['', '12', '1d', '1.5h', '30m1h', '-1h', ' 1h'])
      expect(parseDuration(bad)).toBeUndefined();
  });

  it('returns a deeply frozen object', () => {
    const config = loadConfig('impersonationProxy: {service: {annotations: {a: b}}}');
    expect(Object.isFrozen(config)).toBe(true);
    expect(Object.isFrozen(config.impersonationProxy.service.annotations)).toBe(true);
    expect(() => {
      (config.impersonationProxy as { mode: string }).mode = 'enabled';
    }).toThrow(TypeError);
  });

  it.each([
    ['host only', 'proxy.example.com', 'https://proxy.example.com'],
    ['host and port', 'proxy.example.com:8443', 'https://proxy.example.com:8443'],
    ['https URL', 'https://1.2.3.4:6444', 'https://1.2.3.4:6444'],
    ['default port dropped', 'https://proxy.example.com:443', 'https://proxy.example.com'],
    ['IPv6', '[::1]:8443', 'https://[::1]:8443'],
  ])('normalizes the endpoint (%s)', (_name, endpoint, want) => {
    expect(loadConfig(`impersonationProxy: {endpoint: "${endpoint}"}`).impersonationProxy.endpoint).toBe(
      want,
    );
  });

  it('accepts a full valid config', () => {
    const config = loadConfig(`
impersonationProxy:
  mode: enabled
  endpoint: proxy.example.com
  service:
    type: LoadBalancer
    loadBalancerIP: 10.1.2.3
    annotations:
      service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout: "4000"
  tls:
    secretName: my-tls
    certificateAuthorityData: ${caData}
kubeCertAgent:
  mode: disabled
`);
    expect(config.impersonationProxy.service.loadBalancerIP).toBe('10.1.2.3');
    expect(config.impersonationProxy.tls.secretName).toBe('my-tls');
    expect(config.kubeCertAgent.mode).toBe('disabled');
  });

  it.each<[string, string, ConfigProblem['code'], string]>([
    ['bad mode', 'impersonationProxy: {mode: on}', 'InvalidEnum', 'impersonationProxy.mode'],
    ['mode of wrong type', 'impersonationProxy: {mode: 3}', 'InvalidEnum', 'impersonationProxy.mode'],
    [
      'bad service type',
      'impersonationProxy: {service: {type: NodePort}}',
      'InvalidEnum',
      'impersonationProxy.service.type',
    ],
    ['bad kubeCertAgent mode', 'kubeCertAgent: {mode: sometimes}', 'InvalidEnum', 'kubeCertAgent.mode'],
    ['unknown top-level key', 'impersonationProxi: {}', 'UnknownField', 'impersonationProxi'],
    ['unknown nested key', 'impersonationProxy: {modes: auto}', 'UnknownField', 'impersonationProxy.modes'],
    [
      'unknown key under service',
      'impersonationProxy: {service: {port: 443}}',
      'UnknownField',
      'impersonationProxy.service.port',
    ],
    [
      'unknown key under tls',
      'impersonationProxy: {tls: {caData: x}}',
      'UnknownField',
      'impersonationProxy.tls.caData',
    ],
    ['section is a list', 'impersonationProxy: [a, b]', 'InvalidType', 'impersonationProxy'],
    ['section is a string', 'kubeCertAgent: auto', 'InvalidType', 'kubeCertAgent'],
    [
      'endpoint is a number',
      'impersonationProxy: {endpoint: 443}',
      'InvalidType',
      'impersonationProxy.endpoint',
    ],
    [
      'http endpoint',
      'impersonationProxy: {endpoint: "http://proxy.example.com"}',
      'InvalidValue',
      'impersonationProxy.endpoint',
    ],
    [
      'endpoint with path',
      'impersonationProxy: {endpoint: "https://proxy.example.com/k8s"}',
      'InvalidValue',
      'impersonationProxy.endpoint',
    ],
    [
      'endpoint with bad port',
      'impersonationProxy: {endpoint: "proxy.example.com:99999"}',
      'InvalidValue',
      'impersonationProxy.endpoint',
    ],
    [
      'endpoint with credentials',
      'impersonationProxy: {endpoint: "https://u:p@proxy.example.com"}',
      'InvalidValue',
      'impersonationProxy.endpoint',
    ],
    [
      'loadBalancerIP not an IP',
      'impersonationProxy: {service: {loadBalancerIP: "not-an-ip"}}',
      'InvalidValue',
      'impersonationProxy.service.loadBalancerIP',
    ],
    [
      'annotation value not a string',
      'impersonationProxy: {service: {annotations: {a: 1}}}',
      'InvalidType',
      'impersonationProxy.service.annotations.a',
    ],
    [
      'annotation key malformed',
      'impersonationProxy: {service: {annotations: {"a/b/c": x}}}',
      'InvalidValue',
      'impersonationProxy.service.annotations.a/b/c',
    ],
    [
      'annotations is a list',
      'impersonationProxy: {service: {annotations: [x]}}',
      'InvalidType',
      'impersonationProxy.service.annotations',
    ],
    [
      'CA data not base64 PEM',
      'impersonationProxy: {tls: {secretName: s, certificateAuthorityData: "bm90IGEgY2VydA=="}}',
      'InvalidValue',
      'impersonationProxy.tls.certificateAuthorityData',
    ],
    [
      'CA data without secretName',
      `impersonationProxy: {tls: {certificateAuthorityData: ${caData}}}`,
      'Required',
      'impersonationProxy.tls.secretName',
    ],
    [
      'secretName not a DNS name',
      'impersonationProxy: {tls: {secretName: "My_Secret"}}',
      'InvalidValue',
      'impersonationProxy.tls.secretName',
    ],
    [
      'service None without endpoint',
      'impersonationProxy: {service: {type: None}}',
      'Required',
      'impersonationProxy.endpoint',
    ],
    [
      'loadBalancerIP with ClusterIP',
      'impersonationProxy: {service: {type: ClusterIP, loadBalancerIP: 10.0.0.1}}',
      'Conflict',
      'impersonationProxy.service.loadBalancerIP',
    ],
    [
      'annotations with service None',
      'impersonationProxy: {endpoint: p.example.com, service: {type: None, annotations: {a: b}}}',
      'Conflict',
      'impersonationProxy.service.annotations',
    ],
    ['an ssh mode that is not one', 'ssh: {mode: auto}', 'InvalidEnum', 'ssh.mode'],
    ['an ssh port out of range', 'ssh: {port: 70000}', 'InvalidValue', 'ssh.port'],
    ['an ssh hub name that is no DNS label', 'ssh: {hubName: Hub_1}', 'InvalidValue', 'ssh.hubName'],
    ['a login without its authenticator', 'ssh: {login: {}}', 'InvalidType', 'ssh.login.authenticator'],
    ['a binding lifetime in days', 'ssh: {maxBindingLifetime: 1d}', 'InvalidValue', 'ssh.maxBindingLifetime'],
    [
      'a binding lifetime under 5m',
      'ssh: {maxBindingLifetime: 4m59s}',
      'InvalidValue',
      'ssh.maxBindingLifetime',
    ],
    [
      'a binding lifetime over a week',
      'ssh: {maxBindingLifetime: 169h}',
      'InvalidValue',
      'ssh.maxBindingLifetime',
    ],
    ['an empty binding lifetime', 'ssh: {maxBindingLifetime: ""}', 'InvalidValue', 'ssh.maxBindingLifetime'],
    [
      'a scope with a space',
      'ssh: {login: {authenticator: a, scopes: ["open id"]}}',
      'InvalidValue',
      'ssh.login.scopes.0',
    ],
    [
      'an SSH CA that is a certificate',
      'ssh: {certificateAuthorities: ["ssh-ed25519-cert-v01@openssh.com AAAA"]}',
      'InvalidValue',
      'ssh.certificateAuthorities',
    ],
    [
      'an SSH CA that is not base64',
      'ssh: {certificateAuthorities: ["ssh-ed25519 %%%"]}',
      'InvalidValue',
      'ssh.certificateAuthorities',
    ],
    ['document is a list', '- a\n- b', 'InvalidType', ''],
    ['document is a scalar', 'hello', 'InvalidType', ''],
    ['broken YAML', 'impersonationProxy: {mode: auto', 'InvalidYAML', ''],
    ['duplicate keys', 'kubeCertAgent: {mode: auto}\nkubeCertAgent: {mode: disabled}', 'InvalidYAML', ''],
    [
      'alias bomb',
      'a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]',
      'InvalidYAML',
      '',
    ],
  ])('rejects %s', (_name, text, code, path) => {
    const problems = problemsOf(text);
    expect(problems).toContainEqual(expect.objectContaining({ code, path }));
  });

  it('rejects a config over the size limit without parsing it', () => {
    const problems = problemsOf(`# ${'x'.repeat(MAX_CONFIG_BYTES)}`);
    expect(problems).toEqual([expect.objectContaining({ code: 'TooLarge', path: '' })]);
  });

  it('reports every problem at once, each with its field path, and says them all in the message', () => {
    const text =
      'impersonationProxy: {mode: on, service: {type: None, colour: red}, tls: {secretName: "A B"}}\nextra: 1';
    let error: ConfigError | undefined;
    try {
      loadConfig(text);
    } catch (err) {
      error = err as ConfigError;
    }
    expect(error?.code).toBe('InvalidConfig');
    const paths = error?.problems.map((p) => `${p.code} ${p.path}`).sort();
    expect(paths).toEqual([
      'InvalidEnum impersonationProxy.mode',
      'InvalidValue impersonationProxy.tls.secretName',
      'Required impersonationProxy.endpoint',
      'UnknownField extra',
      'UnknownField impersonationProxy.service.colour',
    ]);
    expect(error?.message).toMatch(/^load config: /);
    expect(error?.message).toContain('impersonationProxy.mode: must be one of auto, enabled, disabled');
  });
});

describe('newConfigSource', () => {
  it('keeps the last good configuration when an edit is rejected, and recovers when it is fixed', () => {
    let text: string | undefined = 'impersonationProxy: {mode: enabled}';
    const rejected: string[] = [];
    const current = newConfigSource(
      () => text,
      (p) => rejected.push(p),
    );
    expect(current().config.impersonationProxy.mode).toBe('enabled');
    expect(current().problem).toBeUndefined();

    text = 'impersonationProxy: {mode: sometimes}';
    const broken = current();
    expect(broken.config.impersonationProxy.mode).toBe('enabled');
    expect(broken.problem).toMatch(/^impersonationProxy\.mode: must be one of/);
    current();
    expect(rejected).toHaveLength(1);

    text = 'impersonationProxy: {mode: disabled}';
    expect(current().config.impersonationProxy.mode).toBe('disabled');
    expect(current().problem).toBeUndefined();
  });

  it('treats a missing ConfigMap as the defaults', () => {
    const current = newConfigSource(
      () => undefined,
      () => {},
    );
    expect(current()).toEqual({ config: loadConfig('') });
  });
});
