// A small Socket.IO server for side-by-side benchmarks (docs/bench/peers/socketio/): ours, not
// Socket.IO's source. scripts/peers.sh starts it with the socket.io package that
// `scripts/peers.sh build socketio` installed from npm into PEERS_SOCKETIO_DIR.
//
//   PEERS_SOCKETIO_DIR=~/.cache/herald/peers/socketio-4.8.4 \
//     node scripts/peers/socketio-server.mjs --port N [--host 127.0.0.1] [--redis redis://…]
//
// What a Socket.IO user would write for "a room per channel, publish over HTTP":
// - Socket.IO on the WebSocket transport only (`transports: ["websocket"]`: no HTTP long-polling
//   and no upgrade; herald-bench --socketio opens `/socket.io/?EIO=4&transport=websocket`).
// - A client joins a room per channel by emitting `subscribe` with the channel name; the
//   acknowledgement (no arguments) tells it that it is in the room.
// - `POST /api/publish` with `Authorization: Bearer <HERALD_API_KEY>` and the body Herald's API
//   takes, `{"channel":"…","data":…}`, does `io.to(channel).emit("publication", channel, data)`
//   and answers `{}`. Socket.IO has no history and no offsets: nothing is kept, a client that was
//   away misses what was emitted meanwhile.
// - `GET /health` answers 200.
// Settings are Socket.IO's defaults (pingInterval 25 s, pingTimeout 20 s, maxHttpBufferSize 1 MB,
// perMessageDeflate off) and the default in-memory adapter: one Node process, single-threaded.
// With `--redis URL` (several processes, one per port), Socket.IO's Redis adapter
// (@socket.io/redis-adapter over ioredis, as its documentation sets it up): an emit reaches the
// room's sockets on this process and is published to Redis for the others.
import http from "node:http";
import { createRequire } from "node:module";
import path from "node:path";

// ES modules do not look at NODE_PATH: resolve socket.io from the peer's install directory.
const require = createRequire(path.join(process.env.PEERS_SOCKETIO_DIR || process.cwd(), "x.js"));
const { Server } = require("socket.io");

const args = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
};
const port = Number(arg("--port", "8000"));
const host = arg("--host", "127.0.0.1");
const apiKey = process.env.HERALD_API_KEY || "benchkey";
const redisUrl = arg("--redis", "");

const httpServer = http.createServer((req, res) => {
  const path = (req.url || "").split("?")[0];
  if (req.method === "GET" && path === "/health") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end("{}");
    return;
  }
  if (req.method === "POST" && path === "/api/publish") {
    if (req.headers.authorization !== `Bearer ${apiKey}`) {
      res.writeHead(401, { "content-type": "application/json" });
      res.end('{"error":"unauthorized"}');
      return;
    }
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      let body;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        body = null;
      }
      if (!body || typeof body.channel !== "string" || body.channel === "") {
        res.writeHead(400, { "content-type": "application/json" });
        res.end('{"error":"expected {\\"channel\\":string,\\"data\\":any}"}');
        return;
      }
      io.to(body.channel).emit("publication", body.channel, body.data);
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
    });
    return;
  }
  // Socket.IO answers its own path (/socket.io/) before this handler runs.
  res.writeHead(404);
  res.end();
});

const io = new Server(httpServer, {
  transports: ["websocket"],
  serveClient: false,
});
if (redisUrl) {
  const { createAdapter } = require("@socket.io/redis-adapter");
  const { Redis } = require("ioredis");
  const pubClient = new Redis(redisUrl);
  const subClient = pubClient.duplicate();
  io.adapter(createAdapter(pubClient, subClient));
}

io.on("connection", (socket) => {
  socket.on("subscribe", (channel, ack) => {
    if (typeof channel !== "string" || channel === "") {
      if (typeof ack === "function") ack({ error: "channel: a non-empty string" });
      return;
    }
    socket.join(channel);
    if (typeof ack === "function") ack();
  });
});

httpServer.listen(port, host, () => {
  console.error(`socketio-server: listening on ${host}:${port}`);
});
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    io.close();
    process.exit(0);
  });
}
