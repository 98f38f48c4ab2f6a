import { describe, expect, it } from 'vitest';
import { PONG, classify, decodeFrame, encodeCommand } from '../../src/codec.js';

describe('encodeCommand', () => {
  it('puts params under the method name, next to the id', () => {
    expect(encodeCommand(3, 'publish', { channel: 'chat', data: { t: 1 } })).toBe(
      '{"id":3,"publish":{"channel":"chat","data":{"t":1}}}',
    );
    expect(PONG).toBe('{}');
  });
});

describe('decodeFrame', () => {
  it('decodes a single message', () => {
    expect(decodeFrame('{"pub":{"channel":"c","offset":7,"data":"x"}}')).toEqual([
      { type: 'pub', channel: 'c', pub: { offset: 7, data: 'x' } },
    ]);
  });

  it('splits newline-batched frames and keeps their order', () => {
    const frame = [
      '{"id":1,"connect":{"client":"a","node":"n","ping_interval":25}}',
      '{"pub":{"channel":"c","offset":1,"data":1}}',
      '{}',
      '{"pub":{"channel":"c","offset":2,"data":2}}',
    ].join('\n');
    const msgs = decodeFrame(frame);
    expect(msgs.map((m) => m.type)).toEqual(['reply', 'pub', 'ping', 'pub']);
    expect(msgs[0]).toMatchObject({ id: 1, method: 'connect', result: { client: 'a' } });
    expect(msgs[3]).toMatchObject({ pub: { offset: 2, data: 2 } });
  });

  it('skips empty lines, a trailing newline and \\r\\n endings', () => {
    const msgs = decodeFrame('{"pub":{"channel":"c","offset":1,"data":1}}\r\n\n\n{}\n');
    expect(msgs.map((m) => m.type)).toEqual(['pub', 'ping']);
    expect(decodeFrame('')).toEqual([]);
    expect(decodeFrame('\n\n')).toEqual([]);
  });

  it('keeps newlines inside JSON strings intact (they are escaped on the wire)', () => {
    const text = JSON.stringify({ pub: { channel: 'c', offset: 1, data: 'two\nlines' } });
    expect(decodeFrame(text)).toEqual([{ type: 'pub', channel: 'c', pub: { offset: 1, data: 'two\nlines' } }]);
  });

  it('reports a bad line without losing the good ones around it', () => {
    const msgs = decodeFrame('{"pub":{"channel":"c","offset":1,"data":1}}\n{not json\n{}');
    expect(msgs.map((m) => m.type)).toEqual(['pub', 'invalid', 'ping']);
  });

  it('rejects non-objects and bad ids', () => {
    expect(decodeFrame('[1,2]')[0].type).toBe('invalid');
    expect(decodeFrame('42')[0].type).toBe('invalid');
    expect(decodeFrame('{"id":0,"publish":{}}')[0].type).toBe('invalid');
    expect(decodeFrame('{"id":"1","publish":{}}')[0].type).toBe('invalid');
  });
});

describe('classify', () => {
  it('reads replies: result under the method, or an error', () => {
    expect(classify({ id: 2, publish: { epoch: 'e', offset: 5 } })).toEqual({
      type: 'reply',
      id: 2,
      method: 'publish',
      result: { epoch: 'e', offset: 5 },
    });
    expect(classify({ id: 2, error: { code: 103, message: 'permission denied' } })).toEqual({
      type: 'reply',
      id: 2,
      error: { code: 103, message: 'permission denied' },
    });
    expect(classify({ id: 9 })).toMatchObject({ type: 'reply', id: 9, result: {} });
  });

  it('reads pushes', () => {
    expect(classify({})).toEqual({ type: 'ping' });
    expect(classify({ pub: { channel: 'c', offset: 3, data: null, info: { user: 'u', client: 'k' } } })).toEqual({
      type: 'pub',
      channel: 'c',
      pub: { offset: 3, data: null, info: { user: 'u', client: 'k' } },
    });
    expect(classify({ join: { channel: 'c', info: { user: 'u', client: 'k' } } })).toEqual({
      type: 'join',
      channel: 'c',
      info: { user: 'u', client: 'k' },
    });
    expect(classify({ leave: { channel: 'c', info: { user: 'u', client: 'k' } } })).toMatchObject({ type: 'leave' });
    expect(
      classify({
        presence_batch: {
          channel: 'c',
          changes: [{ join: { user: 'u', client: 'k' } }, { leave: { user: 'u', client: 'k' } }],
        },
      }),
    ).toEqual({
      type: 'presence_batch',
      channel: 'c',
      changes: [
        { kind: 'join', info: { user: 'u', client: 'k' } },
        { kind: 'leave', info: { user: 'u', client: 'k' } },
      ],
    });
    expect(classify({ presence_batch: { channel: 'c', changes: [{ moved: {} }] } })).toMatchObject({ type: 'invalid' });
    expect(classify({ presence_batch: { channel: 'c' } })).toMatchObject({ type: 'invalid' });
    expect(classify({ presence_count: { channel: 'c', num_clients: 3, num_users: 2 } })).toEqual({
      type: 'presence_count',
      channel: 'c',
      numClients: 3,
      numUsers: 2,
    });
    expect(classify({ presence_count: { channel: 'c', num_clients: '3' } })).toMatchObject({ type: 'invalid' });
    expect(classify({ unsub: { channel: 'c', code: 4003, reason: 'insufficient state' } })).toEqual({
      type: 'unsub',
      channel: 'c',
      code: 4003,
      reason: 'insufficient state',
    });
  });

  it('reads skip pushes and refuses malformed ones', () => {
    expect(classify({ skip: { channel: 'c', from: 3, to: 8 } })).toEqual({
      type: 'skip',
      channel: 'c',
      from: 3,
      to: 8,
    });
    expect(classify({ skip: { channel: 'c', from: 9, to: 8 } })).toMatchObject({ type: 'invalid' });
    expect(classify({ skip: { from: 1, to: 2 } })).toMatchObject({ type: 'invalid' });
  });

  it('reads disconnect pushes, with after_ms and the reconnect flag', () => {
    expect(classify({ disconnect: { code: 4000, reason: 'shutdown', reconnect: true, after_ms: 1500 } })).toEqual({
      type: 'disconnect',
      code: 4000,
      reason: 'shutdown',
      reconnect: true,
      afterMs: 1500,
    });
    // Without the flag, the close-code rule decides.
    expect(classify({ disconnect: { code: 4501, reason: 'unauthorized' } })).toMatchObject({ reconnect: false });
    expect(classify({ disconnect: { code: 4001, reason: 'slow' } })).toMatchObject({ reconnect: true });
  });

  it('ignores unknown pushes instead of failing (forward compatibility)', () => {
    expect(classify({ something_new: { x: 1 } })).toEqual({ type: 'unknown', raw: { something_new: { x: 1 } } });
  });

  it('flags pushes without a channel', () => {
    expect(classify({ pub: { offset: 1, data: 1 } }).type).toBe('invalid');
    expect(classify({ unsub: { code: 1 } }).type).toBe('invalid');
  });
});

describe('server-side subscribe push', () => {
  it('is told apart from a reply by the missing id', () => {
    expect(classify({ subscribe: { channel: 'news', epoch: 'e', offset: 3, recoverable: true } })).toEqual({
      type: 'subscribed',
      channel: 'news',
      result: { epoch: 'e', offset: 3, recoverable: true },
    });
    expect(classify({ id: 4, subscribe: { epoch: 'e', offset: 3, recoverable: true } })).toMatchObject({
      type: 'reply',
    });
  });
});
