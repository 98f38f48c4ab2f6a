// Applying a Fossil delta (https://fossil-scm.org/home/doc/trunk/www/delta_format.wiki), the
// format of Herald's delta compression. Only the applier: the server makes the deltas. Written here
// rather than taken from npm because the SDK ships with no runtime dependency in browsers, and the
// applier is small; it checks the delta's own checksum, so a wrong base cannot go unnoticed.

const DIGITS = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~';
const VALUE = new Int8Array(128).fill(-1);
for (let i = 0; i < DIGITS.length; i++) VALUE[DIGITS.charCodeAt(i)] = i;

/** A delta that cannot be applied to the base it was given. */
export class DeltaError extends Error {}

/** The byte at `i` (-1 past the end). */
function byte(bytes: Uint8Array, i: number): number {
  return bytes[i] ?? -1;
}

/** Fossil's checksum: the sum of the bytes taken as big-endian 32-bit words. */
function checksum(bytes: Uint8Array): number {
  let sum0 = 0;
  let sum1 = 0;
  let sum2 = 0;
  let sum3 = 0;
  let i = 0;
  const n = bytes.length;
  for (; i + 4 <= n; i += 4) {
    sum0 = (sum0 + byte(bytes, i)) | 0;
    sum1 = (sum1 + byte(bytes, i + 1)) | 0;
    sum2 = (sum2 + byte(bytes, i + 2)) | 0;
    sum3 = (sum3 + byte(bytes, i + 3)) | 0;
  }
  sum3 = (sum3 + (sum2 << 8) + (sum1 << 16) + (sum0 << 24)) | 0;
  const left = n - i;
  if (left >= 3) sum3 = (sum3 + (byte(bytes, i + 2) << 8)) | 0;
  if (left >= 2) sum3 = (sum3 + (byte(bytes, i + 1) << 16)) | 0;
  if (left >= 1) sum3 = (sum3 + (byte(bytes, i) << 24)) | 0;
  return sum3 >>> 0;
}

/** Apply `delta` to `base`; both and the result are bytes. Throws `DeltaError` when it does not fit. */
export function applyDelta(base: Uint8Array, delta: Uint8Array): Uint8Array {
  let pos = 0;
  const int = (): number => {
    let v = 0;
    const start = pos;
    while (pos < delta.length) {
      const d = VALUE[byte(delta, pos)] ?? -1;
      if (d < 0) break;
      v = v * 64 + d;
      pos++;
    }
    if (pos === start) throw new DeltaError('delta: number expected');
    return v;
  };
  const size = int();
  if (delta[pos++] !== 0x0a) throw new DeltaError('delta: size not followed by a newline');
  const out = new Uint8Array(size);
  let total = 0;
  while (pos < delta.length) {
    const count = int();
    const op = delta[pos++];
    if (op === 0x40 /* @ */) {
      const offset = int();
      if (delta[pos++] !== 0x2c /* , */) throw new DeltaError('delta: copy without a comma');
      if (total + count > size) throw new DeltaError('delta: copy past the output size');
      if (offset + count > base.length) throw new DeltaError('delta: copy past the end of the base');
      out.set(base.subarray(offset, offset + count), total);
      total += count;
    } else if (op === 0x3a /* : */) {
      if (total + count > size) throw new DeltaError('delta: insert past the output size');
      if (pos + count > delta.length) throw new DeltaError('delta: insert past the end of the delta');
      out.set(delta.subarray(pos, pos + count), total);
      total += count;
      pos += count;
    } else if (op === 0x3b /* ; */) {
      if (total !== size) throw new DeltaError('delta: output size does not match');
      if (count !== checksum(out)) throw new DeltaError('delta: bad checksum (not made from this base)');
      return out;
    } else {
      throw new DeltaError('delta: unknown command');
    }
  }
  throw new DeltaError('delta: unterminated');
}

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

/** Apply a delta carried as text to a base held as text (both UTF-8 on the wire). */
export function applyDeltaText(base: string, delta: string): string {
  const out = applyDelta(encoder.encode(base), encoder.encode(delta));
  try {
    return decoder.decode(out);
  } catch {
    throw new DeltaError('delta: the result is not UTF-8');
  }
}
