"""Fixtures: a real ``herald`` node (HERALD_BIN, default <repo>/target/debug/herald) on a free
loopback port, killed at the end of the session even when a test fails."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
API_KEY = "py-test-key"
SECRET = "py-test-secret"

CONFIG = """
[[namespaces]]
name = "private"
subscribe = "token"

[[namespaces]]
name = "chat"
subscribe = "authenticated"
publish = true
presence = true

[[namespaces]]
name = "deltas"
subscribe = "anonymous"
allow_delta = true
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, port: int, proc: "subprocess.Popen[bytes]", log_path: str) -> None:
        self.port = port
        self.proc = proc
        self.log_path = log_path
        self.http = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}/ws"
        self.api_key = API_KEY
        self.secret = SECRET

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""


@pytest.fixture(scope="session")
def herald_bin() -> str:
    path = os.environ.get("HERALD_BIN") or str(REPO / "target" / "debug" / "herald")
    if not os.access(path, os.X_OK):
        pytest.fail(f"herald binary {path} missing: build it (cargo build -p herald-server) or set HERALD_BIN")
    return path


@pytest.fixture(scope="session")
def node(herald_bin: str) -> Iterator[Node]:
    tmp = tempfile.mkdtemp(prefix="herald-py-")
    cfg = os.path.join(tmp, "herald.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    log_path = os.path.join(tmp, "herald.log")
    port = free_port()
    env = dict(os.environ, RUST_LOG="warn", HERALD_API_KEY=API_KEY, HERALD_TOKEN_HMAC_SECRET=SECRET, HERALD_PING_INTERVAL_S="1",
        HERALD_LIMITS__COMPRESSION="true",  # the conformance suite covers the uncompressed path
    )
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            [herald_bin, "serve", "--dev", "--port", str(port), "--config", cfg],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
        )
    n = Node(port, proc, log_path)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"herald exited during start-up:\n{n.log()}")
            try:
                req = urllib.request.Request(n.http + "/api/info", headers={"Authorization": f"Bearer {API_KEY}"})
                with urllib.request.urlopen(req, timeout=1):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"herald did not answer /api/info within 15 s:\n{n.log()}")
            time.sleep(0.05)
        yield n
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
