// HS256 JWTs for tests, with node:crypto (no dependency).
import { createHmac } from 'node:crypto';

const b64url = (s: string | Buffer) => Buffer.from(s).toString('base64url');

export function signHS256(claims: Record<string, unknown>, secret: string): string {
  const head = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const body = b64url(JSON.stringify(claims));
  const sig = createHmac('sha256', secret).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}
