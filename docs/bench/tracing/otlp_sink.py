#!/usr/bin/env python3
"""A do-nothing OTLP/HTTP receiver for the tracing-on runs: answers every POST with 200 and an
empty body, and counts the requests and bytes it took (printed on SIGINT/SIGTERM).
Usage: python3 otlp_sink.py PORT"""
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

stats = {"requests": 0, "bytes": 0}


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        stats["requests"] += 1
        stats["bytes"] += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def stop(*_):
    print(f"otlp sink: {stats['requests']} requests, {stats['bytes']} bytes", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
