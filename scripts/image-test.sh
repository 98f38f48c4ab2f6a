#!/usr/bin/env bash
# Tests Herald's container image (scripts/image.sh) for real, without a container runtime
# (docs/deploy.md, "Container image"):
#   1. builds the image from a given binary (HERALD_BIN, default target/debug/herald, which CI has
#      built already) into an OCI archive in a temporary directory;
#   2. unpacks the archive as a runtime would: index.json -> manifest -> config and layers, the
#      layers applied in order onto an empty root filesystem;
#   3. checks the image config: a non-root numeric User, Entrypoint set, StopSignal SIGTERM, the
#      port exposed, version and source labels;
#   4. starts the entrypoint exactly as the config says: chroot into the root filesystem, chdir to
#      WorkingDir, drop to User's uid:gid (no supplementary groups), exec Entrypoint + Cmd with the
#      config's Env plus the run's settings (like `docker run -e`: port 0, a drain_ms, keys);
#   5. with a WebSocket client (Node and the `ws` package from npm): /health and /ready answer
#      200, a client connects with a token made by the image's own `herald token`, subscribes, and
#      gets a publication sent through POST /api/publish; then SIGTERM: /ready goes 503 (or the
#      listener is closed), the client gets the disconnect push with code 4000 and
#      after_ms < drain_ms and close 4000, and the process exits 0 within drain_ms + 5 s.
# Every wait is bounded; the node is killed and the temporary directory removed on any exit.
#
#   bash scripts/image-test.sh            the test
#   bash scripts/image-test.sh selftest   the test must fail on broken images: a library removed
#                                         from the root filesystem, User set to root, StopSignal
#                                         SIGKILL
# Environment: HERALD_BIN (default target/debug/herald); HERALD_IMAGE_ARCHIVE (test this OCI
# archive instead of building one); HERALD_IMAGE_TEST_BREAK (missing-lib | root-user | stop-signal:
# what the self-test breaks).
# Must run as root (chroot, dropping to the image's user): it re-runs itself with passwordless sudo
# when it can. buildah is installed when missing.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
repo=$PWD

fail() { echo "image-test: FAIL: $*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  exec sudo -n -E env "PATH=$PATH" bash "$self" "$@"
fi
[ "$(id -u)" -eq 0 ] || fail "run as root (chroot and switching to the image's user need it; no passwordless sudo)"

if [ "${1:-}" = selftest ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/herald-image-selftest.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  if [ -z "${HERALD_IMAGE_ARCHIVE:-}" ]; then
    HERALD_IMAGE_OUT=$work/herald.oci.tar HERALD_BIN=${HERALD_BIN:-target/debug/herald} \
      bash scripts/image.sh
    export HERALD_IMAGE_ARCHIVE=$work/herald.oci.tar
  fi
  for case in "missing-lib:node did not start" "root-user:User runs as root" \
    "stop-signal:StopSignal 'SIGKILL', want SIGTERM"; do
    brk=${case%%:*} want=${case#*:}
    echo "== selftest: $brk must fail with '$want'"
    if HERALD_IMAGE_TEST_BREAK=$brk bash "$self" >"$work/$brk.log" 2>&1; then
      cat "$work/$brk.log"; fail "selftest: the test passed on a broken image ($brk)"
    fi
    grep -q "$want" "$work/$brk.log" || { cat "$work/$brk.log"; fail "selftest: $brk failed without '$want'"; }
    echo "   ok: $(grep -m1 'FAIL' "$work/$brk.log")"
  done
  echo "image-test selftest: OK"
  exit 0
fi

command -v node >/dev/null 2>&1 || fail "node not found (Node.js 18 or later runs the WebSocket client)"

# The WebSocket client library: the SDK's copy of `ws` when installed, else from npm into a cache.
ws_dir=""
for d in "$repo/clients/js/node_modules" "${HOME:-/root}/.cache/herald/image-test/node_modules"; do
  [ -f "$d/ws/package.json" ] && { ws_dir=$d; break; }
done
if [ -z "$ws_dir" ]; then
  echo "== npm install ws (into ~/.cache/herald/image-test)"
  cache=${HOME:-/root}/.cache/herald/image-test
  mkdir -p "$cache"
  timeout 300 npm install --silent --no-audit --no-fund --prefix "$cache" ws@8 >/dev/null
  ws_dir=$cache/node_modules
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/herald-image-test.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

archive=${HERALD_IMAGE_ARCHIVE:-}
if [ -z "$archive" ]; then
  bin=${HERALD_BIN:-target/debug/herald}
  [ -x "$bin" ] || fail "no herald binary at $bin (build it, or set HERALD_BIN)"
  HERALD_IMAGE_OUT=$work/herald.oci.tar HERALD_BIN=$bin bash scripts/image.sh
  archive=$work/herald.oci.tar
fi
[ -f "$archive" ] || fail "no OCI archive at $archive"

# Unpack: the image config (as JSON) and the root filesystem.
rootfs=$work/rootfs
python3 - "$archive" "$rootfs" "$work/config.json" <<'EOF'
import json, sys, tarfile, os, io
archive, rootfs, out = sys.argv[1:]
def fail(msg):
    print(f"image-test: FAIL: {msg}", file=sys.stderr); sys.exit(1)
with tarfile.open(archive) as t:
    blob = lambda d: t.extractfile("blobs/" + d.replace(":", "/")).read()
    index = json.load(t.extractfile("index.json"))
    if len(index.get("manifests", [])) != 1:
        fail(f"index.json names {len(index.get('manifests', []))} manifests, expected 1")
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    os.makedirs(rootfs)
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as lt:
            for m in lt.getmembers():
                name = os.path.basename(m.name)
                if name.startswith(".wh."):
                    fail(f"whiteout {m.name} in a layer: this unpacker does not apply them")
                if m.name.startswith("/") or ".." in m.name.split("/"):
                    fail(f"layer member escapes the root: {m.name}")
            try:  # members were checked above; `filter` exists from Python 3.11.4/3.12
                lt.extractall(rootfs, numeric_owner=True, filter="fully_trusted")
            except TypeError:
                lt.extractall(rootfs, numeric_owner=True)
json.dump(config, open(out, "w"), indent=1)
EOF

# The config, checked, and what starting it takes.
python3 - "$work/config.json" "$work/run.env" "${HERALD_IMAGE_TEST_BREAK:-}" <<'EOF'
import json, shlex, sys
path, out, brk = sys.argv[1:]
conf = json.load(open(path))
c = conf.get("config") or {}
def fail(msg):
    print(f"image-test: FAIL: {msg}", file=sys.stderr); sys.exit(1)
if brk == "root-user":
    c["User"] = "0:0"
if brk == "stop-signal":
    c["StopSignal"] = "SIGKILL"
user = c.get("User", "")
parts = user.split(":")
if not user or not all(p.isdigit() for p in parts) or len(parts) != 2:
    fail(f"User {user!r}: want a numeric uid:gid (Kubernetes runAsNonRoot checks a numeric user)")
uid, gid = (int(p) for p in parts)
if uid == 0:
    fail(f"User runs as root ({user!r})")
ep = c.get("Entrypoint") or []
if not ep:
    fail("no Entrypoint")
if c.get("StopSignal") != "SIGTERM":
    fail(f"StopSignal {c.get('StopSignal')!r}, want SIGTERM (the node drains on it)")
if "8000/tcp" not in (c.get("ExposedPorts") or {}):
    fail(f"port 8000/tcp not exposed: {c.get('ExposedPorts')}")
labels = c.get("Labels") or {}
for key in ("org.opencontainers.image.version", "org.opencontainers.image.source"):
    if not labels.get(key):
        fail(f"label {key} missing")
with open(out, "w") as f:
    f.write(f"uid={uid}\ngid={gid}\n")
    f.write(f"workdir={shlex.quote(c.get('WorkingDir') or '/')}\n")
    f.write("argv=(" + " ".join(shlex.quote(a) for a in ep + (c.get("Cmd") or [])) + ")\n")
    f.write("image_env=(" + " ".join(shlex.quote(e) for e in c.get("Env") or []) + ")\n")
    f.write(f"version={shlex.quote(labels['org.opencontainers.image.version'])}\n")
EOF
# shellcheck disable=SC1091
source "$work/run.env"
echo "image config: user $uid:$gid, workdir $workdir, argv ${argv[*]}, env ${image_env[*]}"

if [ "${HERALD_IMAGE_TEST_BREAK:-}" = missing-lib ]; then
  lib=$(find "$rootfs" -name 'libssl.so*' | head -1)
  [ -n "$lib" ] || fail "selftest: no libssl in the image to remove"
  rm "$lib"
fi

# Runs a command in the image as a container runtime would: chroot, chdir, drop to uid:gid (no
# supplementary groups), exec with exactly the given environment.
#   python3 launch.py N ENV1..ENVN ARGV...
cat > "$work/launch.py" <<'EOF'
import os, sys
rootfs, workdir, uid, gid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = int(sys.argv[5])
env = dict(e.split("=", 1) for e in sys.argv[6:6 + n])
argv = sys.argv[6 + n:]
os.chroot(rootfs)
os.chdir(workdir)
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
os.execve(argv[0], argv, env)
EOF
in_image=(python3 "$work/launch.py" "$rootfs" "$workdir" "$uid" "$gid")

drain_ms=2000
secret="image-test-$RANDOM$RANDOM$RANDOM"
api_key="image-test-key-$RANDOM$RANDOM"
run_env=("${image_env[@]}" HERALD_PORT=0 "HERALD_DRAIN_MS=$drain_ms"
  "HERALD_API_KEY=$api_key" "HERALD_TOKEN_HMAC_SECRET=$secret")

# The image's own `herald token` (also proves the binary runs in it at all).
token=$(timeout 10 "${in_image[@]}" "${#run_env[@]}" "${run_env[@]}" \
  "${argv[0]}" token --sub image-test 2>"$work/token.err") ||
  { cat "$work/token.err" >&2; fail "node did not start: \`herald token\` in the image failed"; }

"${in_image[@]}" "${#run_env[@]}" "${run_env[@]}" "${argv[@]}" >"$work/herald.out" 2>"$work/herald.err" &
pid=$!
show_logs() { echo "--- herald stdout"; cat "$work/herald.out"; echo "--- herald stderr"; tail -30 "$work/herald.err"; } >&2
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/^herald listening on http:\/\/[^ ]*:\([0-9]*\) .*/\1/p' "$work/herald.out" | head -1)
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { show_logs; fail "node did not start within 10 s (no 'herald listening' line)"; }
[ "$(stat -c %u /proc/$pid)" = "$uid" ] || { show_logs; fail "node runs as uid $(stat -c %u /proc/$pid), not $uid"; }
echo "node $version up on port $port as uid $uid (pid $pid)"

cat > "$work/client.mjs" <<'EOF'
// The image test's client: probes, a WebSocket subscriber, an API publish, then SIGTERM.
import http from "node:http";
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
const require = createRequire(process.env.WS_DIR + "/");
const WebSocket = require("ws");

const [port, token, apiKey, pid, drainMs] = process.argv.slice(2);
const base = `http://127.0.0.1:${port}`;
const fail = (msg) => { console.error(`image-test: FAIL: ${msg}`); process.exit(1); };
setTimeout(() => fail(`client: timed out at step '${step}'`), 30000).unref();
let step = "start";

// One kept-alive socket, so /ready can be asked on it after the listener has closed.
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
const get = (path) => new Promise((resolve, reject) => {
  const req = http.get(`${base}${path}`, { agent, timeout: 3000 }, (res) => {
    let body = "";
    res.on("data", (d) => (body += d));
    res.on("end", () => resolve({ status: res.statusCode, body }));
  });
  req.on("timeout", () => req.destroy(new Error(`GET ${path}: no answer in 3 s`)));
  req.on("error", reject);
});
const expect = async (path, status, body) => {
  const r = await get(path);
  if (r.status !== status || JSON.stringify(JSON.parse(r.body)) !== JSON.stringify(body)) {
    fail(`GET ${path}: ${r.status} ${r.body}, want ${status} ${JSON.stringify(body)}`);
  }
  console.log(`GET ${path}: ${r.status} ${r.body}`);
};

step = "probes";
await expect("/health", 200, { status: "ok" });
await expect("/ready", 200, { status: "ready" });

step = "WebSocket connect";
const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
const inbox = [];
let waiter = null;
ws.on("message", (m) => { inbox.push(JSON.parse(m.toString())); waiter?.(); });
let closed = null;
ws.on("close", (code) => { closed = code; waiter?.(); });
ws.on("error", (e) => fail(`WebSocket: ${e.message}`));
const next = async (pred, what) => {
  for (;;) {
    const i = inbox.findIndex(pred);
    if (i >= 0) return inbox.splice(i, 1)[0];
    if (closed !== null) fail(`connection closed (${closed}) before ${what}`);
    await new Promise((r) => (waiter = r));
  }
};
await new Promise((r) => ws.once("open", r));
ws.send(JSON.stringify({ id: 1, connect: { token, name: "image-test" } }));
const c = await next((m) => m.id === 1, "the connect reply");
if (!c.connect) fail(`connect: ${JSON.stringify(c)}`);
step = "subscribe";
ws.send(JSON.stringify({ id: 2, subscribe: { channel: "news" } }));
const s = await next((m) => m.id === 2, "the subscribe reply");
if (!s.subscribe) fail(`subscribe: ${JSON.stringify(s)}`);
console.log(`connected as ${c.connect.client} on node ${c.connect.node}, subscribed to news`);

step = "API publish";
const res = await fetch(`${base}/api/publish`, {
  method: "POST",
  headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
  body: JSON.stringify({ channel: "news", data: { hello: "from the image" } }),
  signal: AbortSignal.timeout(5000),
});
if (res.status !== 200) fail(`POST /api/publish: ${res.status} ${await res.text()}`);
step = "delivery";
const p = await next((m) => m.pub, "the publication");
if (p.pub.channel !== "news" || p.pub.data?.hello !== "from the image") fail(`pub: ${JSON.stringify(p)}`);
console.log(`delivered: ${JSON.stringify(p.pub)}`);

step = "SIGTERM";
await get("/ready"); // the kept-alive socket is open before the signal
writeFileSync(process.env.SIGTERM_AT_FILE, String(Date.now()));
process.kill(Number(pid), "SIGTERM");
step = "/ready while draining";
const until = Date.now() + 3000;
for (;;) {
  let r;
  try { r = await get("/ready"); } catch (e) { console.log(`GET /ready after SIGTERM: ${e.code ?? e.message} (listener closed)`); break; }
  if (r.status === 503) {
    if (JSON.parse(r.body).status !== "draining") fail(`/ready 503 body ${r.body}`);
    console.log(`GET /ready after SIGTERM: 503 ${r.body}`);
    break;
  }
  if (Date.now() > until) fail(`/ready still ${r.status} 3 s after SIGTERM`);
  await new Promise((r) => setTimeout(r, 20));
}
step = "disconnect push";
const d = await next((m) => m.disconnect, "the disconnect push");
const { code, after_ms: after, reconnect } = d.disconnect;
if (code !== 4000 || reconnect !== true || !(after >= 0 && after < Number(drainMs))) {
  fail(`disconnect ${JSON.stringify(d.disconnect)}: want code 4000, reconnect, 0 <= after_ms < ${drainMs}`);
}
step = "close 4000";
while (closed === null) await new Promise((r) => (waiter = r));
if (closed !== 4000) fail(`close code ${closed}, want 4000`);
console.log(`disconnect push ${JSON.stringify(d.disconnect)}, close ${closed}`);

agent.destroy();
process.exit(0);
EOF

WS_DIR=$ws_dir SIGTERM_AT_FILE=$work/sigterm_at timeout 60 node "$work/client.mjs" "$port" "$token" "$api_key" "$pid" "$drain_ms" ||
  { show_logs; fail "the client's checks failed (above)"; }

# The process exits 0 within drain_ms + 5 s of SIGTERM.
sigterm_at=$(cat "$work/sigterm_at")
deadline=$(( sigterm_at + drain_ms + 5000 ))
while kill -0 "$pid" 2>/dev/null; do
  if [ "$(( $(date +%s%N) / 1000000 ))" -gt "$deadline" ]; then
    show_logs; fail "node still running $(( drain_ms + 5000 )) ms after SIGTERM"
  fi
  sleep 0.05
done
rc=0; wait "$pid" || rc=$?
pid=""
took=$(( $(date +%s%N) / 1000000 - sigterm_at ))
[ "$rc" -eq 0 ] || { show_logs; fail "node exited with status $rc after SIGTERM, want 0"; }
grep -q "$secret\|$api_key" "$work/herald.out" "$work/herald.err" && fail "a secret appears in the node's logs"
echo "node exited 0 within ${took} ms of SIGTERM (drain_ms $drain_ms)"
echo "image-test: OK"
