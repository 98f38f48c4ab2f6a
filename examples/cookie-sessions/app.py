"""A web application with cookie sessions that plugs into Herald through its proxy hooks.

It stands for the Django / Rails / Laravel app of a real deployment, in Python's standard library
only (nothing to install). It listens twice:

The public app (--port), for browsers:
- GET /            the chat page (index.html) for a signed-in user, the sign-in form otherwise
- POST /login      sign in with a name: sets the `sessionid` cookie (HttpOnly; the page's script
                   never sees it, the browser sends it on the WebSocket upgrade to Herald)
- POST /logout     ends the session and has Herald close that session's connections
                   (POST /api/disconnect with the client ids the connect hook saw)
- GET /herald.js   the Herald SDK's browser bundle

Herald's proxy hooks (--hook-port), on 127.0.0.1 only: the hooks trust what Herald tells them
(which user a connection is), so only Herald may reach them; the public port answers 404 there.
- POST /herald/connect     connect proxy: the session cookie says who it is, or error 1401
- POST /herald/subscribe   subscribe proxy: `room:*` for signed-in users, `room:staff` only for
                           staff (error 1403)
- POST /herald/publish     publish proxy: text only, at most 500 characters (error 1422),
                           trimmed, a word filter, and signed with the user's name
- POST /herald/rpc         rpc proxy: `whoami`, `stats`

Run it with ./run.sh (app and Herald together), or:
  HERALD_WS=ws://127.0.0.1:8100/ws HERALD_API=http://127.0.0.1:8100 HERALD_API_KEY=… \
    python3 app.py --port 8080 --hook-port 8081
It prints "listening PORT HOOK_PORT" once it accepts connections on both (0 picks free ports).
"""

import argparse
import html
import json
import os
import secrets
import sys
import threading
import time
import urllib.request
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.join(HERE, "..", "..", "clients", "js", "demo", "herald.js")
STAFF = {"admin"}
FILTERED = {"darn": "****", "heck": "****"}

sessions = {}  # sessionid -> user name
session_clients = {}  # sessionid -> Herald client ids the connect hook admitted for it
messages_published = 0
lock = threading.Lock()


def rewrite(text):
    words = [FILTERED.get(w.lower(), w) for w in text.split()]
    return " ".join(words)


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    herald_ws = "ws://127.0.0.1:8100/ws"

    def log_message(self, fmt, *args):
        pass

    def send(self, status, body, content_type="application/json", headers=()):
        raw = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(raw)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)

    def json(self, value):
        self.send(200, json.dumps(value))

    def body(self):
        length = int(self.headers.get("Content-Length", "0"))
        return self.rfile.read(length)

    def session_user(self):
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        sid = cookie.get("sessionid")
        return sessions.get(sid.value) if sid else None

    # -- pages ------------------------------------------------------------------------------

    def do_GET(self):
        if self.path == "/herald.js":
            with open(SDK, "rb") as f:
                return self.send(200, f.read(), "text/javascript")
        if self.path != "/":
            return self.send(404, "not found", "text/plain")
        user = self.session_user()
        if user is None:
            page = LOGIN
        else:
            with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
                page = f.read().replace("{{HERALD_WS}}", html.escape(self.herald_ws))
        self.send(200, page, "text/html; charset=utf-8")

    def do_POST(self):
        form = dict(p.split("=", 1) for p in self.body().decode().split("&") if "=" in p)
        if self.path == "/login":
            name = form.get("name", "").strip().lower()
            if not name.isalnum() or len(name) > 32:
                return self.send(400, "a name is letters and digits, up to 32", "text/plain")
            sid = secrets.token_urlsafe(24)
            sessions[sid] = name
            cookie = f"sessionid={sid}; Path=/; HttpOnly; SameSite=Lax"
            return self.send(303, "", "text/plain", [("Location", "/"), ("Set-Cookie", cookie)])
        if self.path == "/logout":
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
            if "sessionid" in cookie:
                sid = cookie["sessionid"].value
                with lock:
                    sessions.pop(sid, None)
                    clients = session_clients.pop(sid, set())
                # The session is over: so are the connections it opened (in every tab), not
                # only the one of the page that navigates away now.
                for client in clients:
                    herald_api("/api/disconnect", {"client": client})
            return self.send(303, "", "text/plain", [("Location", "/")])
        self.send(404, "not found", "text/plain")


class Hooks(App):
    """Herald's proxy hooks (docs/proxy.md), on the loopback-only hook port."""

    def do_GET(self):
        self.send(404, "not found", "text/plain")

    def do_POST(self):
        name = self.path[len("/herald/"):] if self.path.startswith("/herald/") else ""
        hook = getattr(self, "hook_" + name, None)
        if hook is None:
            return self.send(404, "not found", "text/plain")
        hook(json.loads(self.body() or b"{}"))

    def hook_connect(self, req):
        sid = req.get("cookies", {}).get("sessionid", "")
        with lock:
            user = sessions.get(sid)
            if user is not None:
                session_clients.setdefault(sid, set()).add(req["client"])
        if user is None:
            return self.json({"error": {"code": 1401, "message": "sign in first"}})
        self.json({"result": {
            "user": user,
            "info": {"name": user.title()},
            "data": {"name": user.title(), "staff": user in STAFF},
        }})

    def hook_subscribe(self, req):
        channel, user = req["channel"], req["user"]
        if channel == "room:staff" and user not in STAFF:
            return self.json({"error": {"code": 1403, "message": "staff only"}})
        self.json({"result": {"data": {"topic": channel.split(":", 1)[1].title()}}})

    def hook_publish(self, req):
        global messages_published
        data = req.get("data")
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str) or not text.strip():
            return self.json({"error": {"code": 1422, "message": "a message is {\"text\"}"}})
        if len(text) > 500:
            return self.json({"error": {"code": 1422, "message": "500 characters at most"}})
        with lock:
            messages_published += 1
        self.json({"result": {"data": {
            "text": rewrite(text.strip()),
            "user": req["user"],
            "name": req["user"].title(),
            "at": int(time.time()),
        }}})

    def hook_rpc(self, req):
        method, user = req.get("method"), req["user"]
        if method == "whoami":
            return self.json({"result": {"data": {"user": user, "staff": user in STAFF}}})
        if method == "stats":
            return self.json({"result": {"data": {
                "signed_in": len(set(sessions.values())),
                "messages": messages_published,
            }}})
        self.json({"error": {"code": 1404, "message": f"no method {method!r}"}})


LOGIN = """<!doctype html>
<meta charset="utf-8"><title>Sign in</title>
<h1>Sign in</h1>
<form method="post" action="/login">
  <input name="name" id="name" placeholder="your name" autofocus>
  <button id="signin">Sign in</button>
</form>
"""


def herald_api(path, body):
    """Call Herald's server API (HERALD_API, HERALD_API_KEY); a failure is reported, not raised:
    the user is signed out either way."""
    base = os.environ.get("HERALD_API", "")
    if not base:
        return
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={
            "Authorization": "Bearer " + os.environ.get("HERALD_API_KEY", ""),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            answer.read()
    except OSError as e:
        print(f"herald {path} failed: {e}", file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8080, help="the public app (0: a free port)")
    parser.add_argument("--hook-port", type=int, default=8081,
                        help="Herald's hooks, on 127.0.0.1 only (0: a free port)")
    args = parser.parse_args()
    App.herald_ws = os.environ.get("HERALD_WS", App.herald_ws)
    servers = []
    for handler, port in ((App, args.port), (Hooks, args.hook_port)):
        server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        server.daemon_threads = True
        servers.append(server)
    print("listening", *(s.server_address[1] for s in servers), flush=True)
    threading.Thread(target=servers[1].serve_forever, daemon=True).start()
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
