"""A stand-in for the model hub on loopback (the real hub cannot be reached here): the few HTTP routes the real
huggingface_hub client uses to list and fetch a commit, answered as the hub answers them (huggingface_hub 2.4:
hf_api.model_info reads /api/models/<repo>/revision/<rev>?blobs=true; file_download reads X-Repo-Commit,
X-Linked-Etag, X-Linked-Size on HEAD /<repo>/resolve/<rev>/<file>, then GETs it with Range to resume;
utils/_http.hf_raise_for_status maps X-Error-Code RevisionNotFound / RepoNotFound).

Faults for the tests: ``corrupt`` (path -> bytes served instead of the listed ones), ``drop_after`` (path ->
bytes after which the first GET closes the connection), ``branches`` (name -> commit). It counts the bytes
of file bodies it served (``served_bytes``) and the Range requests it answered.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse


@dataclass
class HubRepo:
    repo: str
    commit: str
    files: dict[str, bytes]
    lfs: set[str] = field(default_factory=set)  # paths listed as LFS files (with their sha256)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn:
    def __init__(self, repos: list[HubRepo]):
        self.repos = {repo.repo: repo for repo in repos}
        self.branches: dict[str, str] = {}
        self.corrupt: dict[str, bytes] = {}
        self.drop_after: dict[str, int] = {}
        self.served_bytes = 0
        self.range_requests: list[str] = []
        self.lock = threading.Lock()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                stand_in._answer(self, body=False)

            def do_GET(self):
                stand_in._answer(self, body=True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "HubStandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _commit(self, repo: HubRepo, revision: str):
        if revision == repo.commit:
            return repo.commit
        return self.branches.get(revision)

    def _error(self, handler, status: int, code: str) -> None:
        body = json.dumps({"error": code}).encode()
        handler.send_response(status)
        handler.send_header("X-Error-Code", code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _json(self, handler, document: dict) -> None:
        body = json.dumps(document).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _answer(self, handler, body: bool) -> None:
        url = urlparse(handler.path)
        path = unquote(url.path)
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        match = info or resolve
        repo = self.repos.get(match.group(1)) if match else None
        if repo is None:
            return self._error(handler, 404, "RepoNotFound")
        commit = self._commit(repo, match.group(2))
        if commit is None:
            return self._error(handler, 404, "RevisionNotFound")
        if info:
            siblings = []
            for name, data in sorted(repo.files.items()):
                sibling = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
                if name in repo.lfs:
                    sibling["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
                siblings.append(sibling)
            return self._json(handler, {"id": repo.repo, "sha": commit, "siblings": siblings, "private": False})
        name = resolve.group(3)
        if name not in repo.files:
            return self._error(handler, 404, "EntryNotFound")
        listed = repo.files[name]
        data = self.corrupt.get(name, listed)
        etag = hashlib.sha256(listed).hexdigest() if name in repo.lfs else git_blob_id(listed)
        start = 0
        wanted = handler.headers.get("Range")
        if wanted and body:
            start = int(re.fullmatch(r"bytes=(\d+)-\d*", wanted).group(1))
            with self.lock:
                self.range_requests.append(name)
        handler.send_response(206 if start else 200)
        handler.send_header("X-Repo-Commit", commit)
        handler.send_header("ETag", f'"{etag}"')
        if name in repo.lfs:
            handler.send_header("X-Linked-Etag", f'"{etag}"')
            handler.send_header("X-Linked-Size", str(len(listed)))
        if start:
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        handler.send_header("Content-Length", str(len(data) - start))
        handler.end_headers()
        if not body:
            return
        chunk = data[start:]
        drop = self.drop_after.pop(name, None) if not start else None
        if drop is not None:
            handler.wfile.write(chunk[:drop])
            handler.wfile.flush()
            with self.lock:
                self.served_bytes += drop
            handler.close_connection = True
            handler.connection.shutdown(2)
            return
        handler.wfile.write(chunk)
        with self.lock:
            self.served_bytes += len(chunk)
