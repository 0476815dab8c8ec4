"""DRY RUN ONLY (no GPU here): a stand-in for `vllm serve` / `lmcache server` that lets bench/gpu/run.py's plumbing
(start, ready, stop, /dev/shm cleanup, records, cards, packing) run on a machine without a GPU. It serves the real
vLLM 0.26 capture tests/fixtures/gpu-h200-vllm0.26/offload-eager/00-idle.txt as /metrics (so the tiers are labelled
cold: the dry run proves the harness, never a tier), and for an OffloadingConnector it maps a /dev/shm segment as
vLLM 0.26's TieringOffloadingSpec does, and leaves it behind when killed.

    fake_engine.py vllm serve MODEL --port N [...] | fake_engine.py lmcache server --http-port N [...]
"""

import http.server
import mmap
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))
from fake_openai import FakeOpenAI  # noqa: E402

args = sys.argv[1:]
if args[0] == "lmcache":
    port = int(args[args.index("--http-port") + 1])

    class Health(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"ok" if self.path == "/healthcheck" else b"lmcache_mp_l1_write_chunks_total 0.0\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Health).serve_forever()
port = int(args[args.index("--port") + 1])
config = args[args.index("--kv-transfer-config") + 1] if "--kv-transfer-config" in args else "{}"
segment = None
if "TieringOffloadingSpec" in config:
    path = f"/dev/shm/vllm_offload_{uuid.uuid4().hex}.mmap"
    with open(path, "w+b") as f:
        f.truncate(1 << 20)
        segment = mmap.mmap(f.fileno(), 1 << 20)
server = FakeOpenAI(port)
if "--served-model-name" in args:  # as the rendered command names it (bench/gpu/pays.py serves "pays")
    server.served_names = [args[args.index("--served-model-name") + 1]]
server.metrics_text = (REPO / "tests/fixtures/gpu-h200-vllm0.26/offload-eager/00-idle.txt").read_text()
server.__enter__()
server._thread.join()
