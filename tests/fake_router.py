"""A stand-in for vllm-router behind rigkit/files/router_front.py: it takes ``--host``/``--port`` last (as the front
appends them), waits STARTUP_S before it binds (vllm-router binds only once its workers answered), answers every
request 200 with its PID, and on SIGTERM stops accepting and finishes what it serves (vllm-router's graceful
shutdown)."""

import argparse
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTUP_S = 1.0
SERVE_S = 0.05  # each answer takes this long: requests are in flight when a restart comes


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        time.sleep(SERVE_S)
        body = f'{{"pid": {os.getpid()}}}'.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()
    time.sleep(STARTUP_S)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = False
    server.block_on_close = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    server.server_close()
