#!/usr/bin/env node
// Proves every scenario can fail: for each one, a mutant (a broken expectation, a broken server
// step, or an adapter whose SDK is broken on purpose via CONFORMANCE_MUTANT) must make the driver
// report FAIL. Run: node driver/selftest.mjs --adapter "node adapters/js/adapter.mjs"
// (the CONFORMANCE_MUTANT cases only apply to adapters that implement them; the JS one does).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const i = process.argv.indexOf('--adapter');
const adapter = i > 0 ? process.argv[i + 1] : 'node adapters/js/adapter.mjs';

const setExpect = (pred, patch) => (sc) => {
  const x = sc.expect.find(pred);
  if (!x) throw new Error(`selftest: no expectation to mutate in ${sc.name}`);
  Object.assign(x, patch);
};
const pubs = (ch) => (x) => x.check === 'publications' && x.channel === ch;

const mutants = [
  ['01-connect-subscribe-publish.json', 'publications expected in another order',
    setExpect(pubs('room'), { data: [{ n: 1 }, { n: 3 }, { n: 2 }, { n: 4 }] })],
  ['02-drop-and-recover.json', 'an SDK without backoff (reconnects in a tight loop)', null, 'no-backoff'],
  ['02-drop-and-recover.json', 'a publication made during the outage left out of the expectation',
    setExpect(pubs('feed'), { data: [{ n: 1 }, { n: 2 }, { n: 3 }, { n: 5 }, { n: 6 }, { n: 7 }, { n: 8 }] })],
  ['03-recovery-fails.json', 'history big enough: recovery succeeds, so recovered: false never comes',
    (sc) => (sc.server.env.HERALD_DEFAULT_NAMESPACE__HISTORY_SIZE = '100')],
  ['04-drain-reconnect.json', 'an SDK that ignores after_ms', null, 'ignore-after-ms'],
  ['04-drain-reconnect.json', 'the several-node expectations on one node: the restart loses the epoch, the reconnect comes back to the same node',
    (sc) => (sc.expect = sc.cluster.expect)],
  ['04-drain-reconnect.json', 'three nodes that do not share a broker (each in memory): recovery on another node fails',
    (sc) => (sc.server.env.HERALD_BROKER_URL = 'memory'), null, 3],
  ['05-permanent-close-api-disconnect.json', 'a disconnect code that allows reconnecting (4000 via the API)',
    (sc) => (sc.steps.find((s) => s.path === '/api/disconnect').body.code = 4000)],
  ['06-permanent-close-invalid-token.json', 'a valid token: the client connects',
    (sc) => delete sc.steps[0].args.token.secret],
  ['07-token-refresh.json', 'the "fresh" token expires as soon as the first: the server closes 4004 at expiry',
    (sc) => (sc.steps[0].args.tokens[1] = sc.steps[0].args.tokens[0])],
  ['08-server-side-subscription.json', 'the API does not unsubscribe (another user): publications continue',
    (sc) => (sc.steps.find((s) => s.path === '/api/unsubscribe').body.user = 'carol')],
  ['09-delayed-then-reset.json', 'claim that publication 4 reached the client before the reset (it was still in the delay)',
    setExpect((x) => x.check === 'order', { matches: [{ event: 'publication', data: { n: 4 } }, { event: 'disconnected' }] })],
  ['10-dead-connection.json', 'an SDK that waits 20 s past ping_interval: the silence goes unnoticed',
    (sc) => (sc.steps[0].args.ping_grace_ms = 20000)],
  ['11-server-side-recovery-fails.json', 'history big enough: the server-side channel recovers',
    (sc) => (sc.server.env.HERALD_DEFAULT_NAMESPACE__HISTORY_SIZE = '100')],
  ['12-tags-and-skip-history.json', 'the subscription without its tag filter: the publications it leaves out come',
    (sc) => delete sc.steps.find((s) => s.cmd === 'subscribe' && s.args.tf).args.tf],
  ['12-tags-and-skip-history.json', 'the typing publication stored (no skip_history): it has an offset',
    (sc) => (sc.steps.find((s) => s.body?.skip_history).body.skip_history = false)],
  ['13-delta-compression.json', 'the subscription without delta: the node computes no delta',
    (sc) => delete sc.steps.find((s) => s.cmd === 'subscribe').args.delta],
  ['13-delta-compression.json', 'the namespace without allow_delta: the subscribe is refused (108)',
    (sc) => delete sc.server.env.HERALD_DEFAULT_NAMESPACE__ALLOW_DELTA],
];

const dir = mkdtempSync(join(tmpdir(), 'herald-conformance-selftest-'));
let bad = 0;
for (const [file, why, mutate, envMutant, nodes] of mutants) {
  const sc = JSON.parse(readFileSync(join(root, 'scenarios', file), 'utf8'));
  if (mutate) mutate(sc);
  const f = join(dir, file);
  writeFileSync(f, JSON.stringify(sc));
  const args = [join(root, 'driver', 'driver.mjs'), '--adapter', adapter, '--nodes', String(nodes ?? 1), f];
  const r = spawnSync(process.execPath, args, {
    env: { ...process.env, ...(envMutant ? { CONFORMANCE_MUTANT: envMutant } : {}) },
    encoding: 'utf8',
    timeout: 120_000,
  });
  const first = (r.stdout ?? '').split('\n')[0];
  const why2 = (r.stdout ?? '').split('\n')[1]?.trim() ?? '';
  const caught = r.status === 1 && first.startsWith('FAIL');
  if (!caught) bad++;
  console.log(`${caught ? 'caught ' : 'MISSED '} ${file}: ${why}${caught ? ` → ${why2.slice(0, 300)}` : ` (exit ${r.status}: ${first})`}`);
}
rmSync(dir, { recursive: true, force: true });
console.log(bad ? `selftest: ${bad} mutant(s) not caught` : 'selftest: every mutant caught');
process.exit(bad ? 1 : 0);
