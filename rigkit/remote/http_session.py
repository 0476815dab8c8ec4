"""HTTP sessions to the servers rigkit talks to (vLLM, the router, the registry), safe against keep-alive races.

A server closes an idle keep-alive connection after its own timeout: vLLM after VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
5 s by default (vllm/envs.py). A request written on a pooled connection just as the server closes it gets no
answer at all (``RemoteDisconnected``), and through an SSH tunnel the close reaches the client later still.
Validation scrapes /metrics, waits seconds for a completion streamed from the rig, then scrapes again: exactly
that idle gap. These sessions never reuse a connection that sat idle longer than REUSE_IDLE_LIMIT_S, well
inside any server's keep-alive, so the race cannot happen. A GET that gets no answer (through the SSH tunnel a
connection can still be dropped: the lab's rollout cache proof saw RemoteDisconnected with the idle limit in
place) is sent once more on a new connection: reading /v1/models or /metrics moves no counter. Nothing else is
retried once sent (a retried completion would be counted twice by the cache counters).
"""

from __future__ import annotations

import time

import requests
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ReadTimeoutError
from urllib3.util.retry import Retry

# below vLLM's 5 s keep-alive with room for a loaded controller and the tunnel's delay
REUSE_IDLE_LIMIT_S = 2.0


class _DroppedOnly(Retry):
    """Retries a request the server dropped, never one it is slow to answer: a read timeout stays a timeout."""

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):
        if isinstance(error, ReadTimeoutError):
            raise error
        return super().increment(method, url, response, error, _pool, _stacktrace)


# one more try for a GET the server dropped unanswered; never for another method, a refused connection, an HTTP
# status or a timeout
ONE_RETRY = _DroppedOnly(
    total=1,
    connect=0,
    read=1,
    other=0,
    status=0,
    redirect=0,
    allowed_methods=frozenset({"GET"}),
    raise_on_status=False,
    respect_retry_after_header=False,
)


class _IdleLimited:
    """A connection pool that reconnects instead of reusing a connection idle longer than the limit."""

    def _put_conn(self, conn):
        if conn is not None:
            conn.rigkit_idle_since = time.monotonic()
        super()._put_conn(conn)

    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)
        idle_since = getattr(conn, "rigkit_idle_since", None)
        if idle_since is not None and time.monotonic() - idle_since > REUSE_IDLE_LIMIT_S:
            conn.close()  # the pool opens it again on the next request, as for a connection it saw dropped
        return conn


class _IdleLimitedHTTPPool(_IdleLimited, HTTPConnectionPool):
    pass


class _IdleLimitedHTTPSPool(_IdleLimited, HTTPSConnectionPool):
    pass


class _IdleLimitedAdapter(HTTPAdapter):
    def __init__(self) -> None:
        super().__init__(max_retries=ONE_RETRY)

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _IdleLimitedHTTPPool, "https": _IdleLimitedHTTPSPool}


def server_session() -> requests.Session:
    """A requests.Session whose pooled connections are never reused after REUSE_IDLE_LIMIT_S idle."""
    session = requests.Session()
    adapter = _IdleLimitedAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
