#!/usr/bin/env python3
"""A sample upstream for the sidecar's examples: POST creates a payment (a
side effect, counted) and answers 201 with the coordination headers it saw;
GET lists the payments. Standard library only.

    python3 upstream.py [PORT]     # default 3000
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
payments = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if status == 201:
            self.send_header("location", f"/payments/{body['payment']}")
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        request = self.rfile.read(length)
        with lock:
            payments.append(request.decode(errors="replace"))
            number = len(payments)
        self._answer(201, {
            "payment": number,
            "idempotency_key": self.headers.get("idempotency-key"),
            "fencing_token": self.headers.get("idempotency-fencing-token"),
            "attempt": self.headers.get("idempotency-attempt"),
        })

    def do_GET(self):
        with lock:
            self._answer(200, {"payments": len(payments)})

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()
