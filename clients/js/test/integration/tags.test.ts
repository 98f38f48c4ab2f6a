// Tags, tag filters and skip_history against the real server: a subscription with `tagsFilter`
// gets only the matching publications (with their tags) and stays subscribed over the holes its
// filter leaves; a publication sent with `skip_history` reaches a plain subscriber without an
// offset and does not move its position, so the next stored one is delivered, not taken as a gap.
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { Herald, type PublicationContext } from '../../src/node.js';
import { HeraldServer, waitFor } from '../support/server.js';

let server: HeraldServer;
const clients: Herald[] = [];

beforeAll(async () => {
  server = await HeraldServer.start(inject('heraldBin'), {
    env: { HERALD_DEFAULT_NAMESPACE__ALLOW_TAGS_FILTER: 'true' },
  });
});
afterEach(() => {
  for (const c of clients.splice(0)) c.disconnect();
});
afterAll(async () => {
  await server?.stop();
});

type Got = Array<Pick<PublicationContext, 'offset' | 'data' | 'tags'>>;

describe('tags, tag filters and skip_history', () => {
  it('filters on tags, hands tags to the app, and delivers unstored publications', async () => {
    const c = new Herald(server.ws, { minReconnectDelayMs: 100, maxReconnectDelayMs: 500 });
    clients.push(c);
    const goals: Got = [];
    const all: Got = [];
    const record = (into: Got) => (p: PublicationContext) => {
      const entry: Got[number] = { offset: p.offset, data: p.data };
      if (p.tags) entry.tags = p.tags;
      into.push(entry);
    };
    const filtered = c.subscribe('js-match', {
      tagsFilter: { key: 'kind', cmp: 'eq', val: 'goal' },
      onPublication: record(goals),
    });
    const plain = c.subscribe('js-match-all', { onPublication: record(all) });
    let resubscribed = 0;
    filtered.on('subscribed', (s) => {
      if (s.resubscribed) resubscribed++;
    });
    c.connect();
    await Promise.all([filtered.ready(), plain.ready()]);

    const publish = (channel: string, data: unknown, extra: Record<string, unknown> = {}) =>
      server.api('/api/publish', { channel, data, ...extra });
    await publish('js-match', 1, { tags: { kind: 'goal' } });
    await publish('js-match', 2, { tags: { kind: 'card' } });
    await publish('js-match', 3);
    await publish('js-match', 4, { tags: { kind: 'goal' } });
    await publish('js-match-all', 'a');
    await publish('js-match-all', 'typing', { skip_history: true, tags: { kind: 'typing' } });
    await publish('js-match-all', 'b');

    await waitFor(() => goals.length === 2 && all.length === 3, 'the publications');
    expect(goals).toEqual([
      { offset: 1, data: 1, tags: { kind: 'goal' } },
      { offset: 4, data: 4, tags: { kind: 'goal' } },
    ]);
    expect(all).toEqual([
      { offset: 1, data: 'a' },
      { offset: 0, data: 'typing', tags: { kind: 'typing' } },
      { offset: 2, data: 'b' },
    ]);
    expect(filtered.position?.offset).toBe(4);
    expect(plain.position?.offset).toBe(2);
    expect(resubscribed).toBe(0);
    expect(filtered.state).toBe('subscribed');
  });

  it('refuses a filter where the namespace does not allow it', async () => {
    const other = await HeraldServer.start(inject('heraldBin'));
    try {
      const c = new Herald(other.ws, { minReconnectDelayMs: 100, maxReconnectDelayMs: 500 });
      clients.push(c);
      const sub = c.subscribe('js-x', { tagsFilter: { key: 'k', cmp: 'ex' } });
      c.connect();
      await expect(sub.ready()).rejects.toMatchObject({ code: 108 });
    } finally {
      await other.stop();
    }
  });
});
