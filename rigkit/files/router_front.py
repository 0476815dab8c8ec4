#!/usr/bin/env python3
"""Runs ON the gateway (and in the lab): holds the router's listening socket and supervises vllm-router behind it.

Usage: router_front.py --listen HOST:PORT --argv-file FILE --restart-delay S --ready-timeout S --stop-timeout S

vllm-router binds its own port (vllm-project/router src/server.rs: ``TcpListener::bind`` once its workers answered;
no socket activation, no SO_REUSEPORT): restarted in place, it refuses every connection until the new process has
waited for its workers and bound again (2-5 s on the lab). So this process owns the port clients use, for its whole
life, and relays each connection, byte for byte, to the router it runs on a loopback port of its own. While no router
is ready (restarting, or dead and about to be restarted) a connection waits, accepted, up to --ready-timeout: a
client sees a slower answer, not a refusal.

- The router's argv is read from --argv-file (a JSON list) at each start; this process adds ``--host 127.0.0.1
  --port <a free port>``. A config change or an upgrade rewrites the file and sends SIGHUP (``systemctl reload``):
  new connections are held, the router finishes what it serves (SIGTERM: vllm-router's graceful shutdown), the new
  one starts from the file, connections go to it once it accepts.
- A router that dies is started again after --restart-delay (the same figure as the unit's RestartSec).
- SIGTERM or SIGINT: the router is stopped, then this process exits.
Standard library only: it runs in the router's venv on the gateway and in rigkit's venv in the lab.
"""

import argparse
import asyncio
import json
import signal
import socket
import sys
import time

BACKEND_HOST = "127.0.0.1"
CONNECT_RETRY_S = 0.05
# Connections the relay opened to the router just before a restart was asked are accepted by it before it is told to
# stop, so none lands in the backlog of a listener about to close.
HANDOVER_PAUSE_S = 0.3
CHUNK = 65536
ATTEMPTS = 3  # routers a request is offered to before its connection is closed unanswered


def log(line: str) -> None:
    print(f"router_front: {line}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((BACKEND_HOST, 0))
        return probe.getsockname()[1]


def listening_socket(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family, kind, proto, _, address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class Front:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.backend_port = None  # the router's port while it accepts; None while no router is ready
        self.ready = asyncio.Event()
        self.process = None
        self.stopping = False
        self.restart_asked = asyncio.Event()

    async def backend(self):
        """A connection to the ready router, waiting for one up to the ready timeout."""
        deadline = time.monotonic() + self.args.ready_timeout
        while time.monotonic() < deadline:
            port = self.backend_port
            if port is not None:
                try:
                    return await asyncio.open_connection(BACKEND_HOST, port)
                except OSError:
                    pass
            await asyncio.sleep(CONNECT_RETRY_S)
        return None

    async def relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """Relay one client connection. What the client sent is kept until the router's first byte of answer: a
        router that closes the connection before answering (it was stopped with the connection in its backlog, or it
        crashed) gets none of it; the bytes go to the next ready router, as vllm-router retries a worker's refusal."""
        sent = bytearray()
        state = {"writer": None, "answered": False, "eof": False}

        async def from_client() -> None:
            while True:
                try:
                    data = await client_reader.read(CHUNK)
                except (ConnectionError, OSError):
                    data = b""
                writer = state["writer"]
                if not data:
                    state["eof"] = True
                    if writer is not None and writer.can_write_eof():
                        try:
                            writer.write_eof()
                        except OSError:
                            pass
                    return
                if not state["answered"]:
                    sent.extend(data)
                if writer is not None:
                    try:
                        writer.write(data)
                        await writer.drain()
                    except (ConnectionError, OSError):
                        pass  # this attempt fails; the next gets ``sent``

        pump = asyncio.ensure_future(from_client())
        try:
            for _ in range(ATTEMPTS):
                connection = await self.backend()
                if connection is None:
                    return
                backend_reader, backend_writer = connection
                state["writer"] = backend_writer
                backend_writer.write(bytes(sent))
                if state["eof"] and backend_writer.can_write_eof():
                    backend_writer.write_eof()
                try:
                    first = await backend_reader.read(CHUNK)
                except (ConnectionError, OSError):
                    first = b""
                if not first:
                    state["writer"] = None
                    backend_writer.close()
                    continue
                state["answered"] = True
                sent.clear()
                client_writer.write(first)
                await pipe(backend_reader, client_writer)
                backend_writer.close()
                await pump
                return
        finally:
            pump.cancel()
            client_writer.close()

    async def start_router(self) -> None:
        with open(self.args.argv_file) as argv_file:
            argv = json.load(argv_file)
        port = free_port()
        self.process = await asyncio.create_subprocess_exec(*argv, "--host", BACKEND_HOST, "--port", str(port))
        log(f"router started (pid {self.process.pid}) on {BACKEND_HOST}:{port}")
        deadline = time.monotonic() + self.args.ready_timeout
        while self.process.returncode is None and time.monotonic() < deadline:
            try:
                _, writer = await asyncio.open_connection(BACKEND_HOST, port)
            except OSError:
                await asyncio.sleep(CONNECT_RETRY_S)
                continue
            writer.close()
            self.backend_port = port
            log(f"router ready (pid {self.process.pid})")
            return

    async def stop_router(self) -> None:
        """Hold new connections, let the router finish what it serves, stop it."""
        self.backend_port = None
        if self.process is None or self.process.returncode is not None:
            return
        await asyncio.sleep(HANDOVER_PAUSE_S)
        self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), self.args.stop_timeout)
        except asyncio.TimeoutError:
            log(f"router (pid {self.process.pid}) did not stop within {self.args.stop_timeout} s: killed")
            self.process.kill()
            await self.process.wait()

    async def supervise(self) -> None:
        while not self.stopping:
            await self.start_router()
            exited = asyncio.ensure_future(self.process.wait())
            asked = asyncio.ensure_future(self.restart_asked.wait())
            await asyncio.wait([exited, asked], return_when=asyncio.FIRST_COMPLETED)
            asked.cancel()
            if self.stopping:
                break
            if self.restart_asked.is_set():
                self.restart_asked.clear()
                log("restart asked (SIGHUP): new connections wait for the new router")
                await self.stop_router()
                continue
            self.backend_port = None
            log(f"router exited ({self.process.returncode}): started again in {self.args.restart_delay} s")
            await asyncio.sleep(self.args.restart_delay)

    def ask_restart(self) -> None:
        self.backend_port = None  # at once: nothing new reaches the router about to stop
        self.restart_asked.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        sock = listening_socket(self.args.listen)
        server = await asyncio.start_server(self.relay, sock=sock)
        log(f"listening on {self.args.listen}")
        supervisor = asyncio.ensure_future(self.supervise())
        done = asyncio.Event()

        def stop() -> None:
            self.stopping = True
            self.restart_asked.set()
            done.set()

        loop.add_signal_handler(signal.SIGHUP, self.ask_restart)
        loop.add_signal_handler(signal.SIGTERM, stop)
        loop.add_signal_handler(signal.SIGINT, stop)
        await done.wait()
        server.close()
        await self.stop_router()
        supervisor.cancel()
        log("stopped")


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--argv-file", required=True)
    parser.add_argument("--restart-delay", type=float, required=True)
    parser.add_argument("--ready-timeout", type=float, required=True)
    parser.add_argument("--stop-timeout", type=float, required=True)
    asyncio.run(Front(parser.parse_args(argv)).run())


if __name__ == "__main__":
    main(sys.argv[1:])
