"""A web application with cookie sessions that plugs into Herald through its proxy hooks.

It stands for the Django / Rails / Laravel app of a real deployment, in Python's standard library
only (nothing to install):

- GET /            the chat page (index.html) for a signed-in user, the sign-in form otherwise
- POST /login      sign in with a name: sets the `sessionid` cookie (HttpOnly; the page's script
                   never sees it, the browser sends it on the WebSocket upgrade to Herald)
- POST /logout     ends the session
- GET /herald.js   the Herald SDK's browser bundle
- POST /herald/connect     connect proxy: the session cookie says who it is, or error 1401
- POST /herald/subscribe   subscribe proxy: `room:*` for signed-in users, `room:staff` only for
                           staff (error 1403)
- POST /herald/publish     publish proxy: text only, at most 500 characters (error 1422),
                           trimmed, a word filter, and signed with the user's name
- POST /herald/rpc         rpc proxy: `whoami`, `stats`

Run it with ./run.sh (app and Herald together), or:
  HERALD_WS=ws://127.0.0.1:8000/ws python3 app.py --port 8080
It prints "listening PORT" once it accepts connections.
"""

import argparse
import html
import json
import os
import secrets
import threading
import time
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.join(HERE, "..", "..", "clients", "js", "demo", "herald.js")
STAFF = {"admin"}
FILTERED = {"darn": "****", "heck": "****"}

sessions = {}  # sessionid -> user name
messages_published = 0
lock = threading.Lock()


def rewrite(text):
    words = [FILTERED.get(w.lower(), w) for w in text.split()]
    return " ".join(words)


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    herald_ws = "ws://127.0.0.1:8000/ws"

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
        if self.path.startswith("/herald/"):
            req = json.loads(self.body() or b"{}")
            return getattr(self, "hook_" + self.path[len("/herald/"):])(req)
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
                sessions.pop(cookie["sessionid"].value, None)
            return self.send(303, "", "text/plain", [("Location", "/")])
        self.send(404, "not found", "text/plain")

    # -- Herald's proxy hooks (docs/proxy.md) -----------------------------------------------

    def hook_connect(self, req):
        user = sessions.get(req.get("cookies", {}).get("sessionid", ""))
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    App.herald_ws = os.environ.get("HERALD_WS", App.herald_ws)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), App)
    server.daemon_threads = True
    print("listening", server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
