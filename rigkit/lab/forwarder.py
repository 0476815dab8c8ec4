"""A TCP forwarder whose listening socket lives in another network namespace (stdlib only).

A rig in its own network namespace must pull from the lab registry by the same reference as every
other rig (127.0.0.1:5000/...@sha256:...), but the registry listens on the host's loopback. This
process enters the rig's namespace just long enough to bind 127.0.0.1:5000 there, returns to the
host's namespace, and relays every accepted connection to the registry on the host's loopback.
A socket stays in the namespace it was created in, so no veth, route or registry address change is
needed. It exits by itself when the rig's namespace is gone (the container stopped or restarted),
so it never keeps a dead namespace alive; `rigkit lab up` starts a new one for the new namespace.

    python3 forwarder.py --listen-netns /proc/<rig pid>/ns/net --listen 127.0.0.1:5000 --connect 127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
import threading
import time

CLONE_NEWNET = 0x40000000
BUFFER_BYTES = 256 * 1024
WATCH_INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 10.0


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


def setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def listen_in_netns(netns_path: str, address: tuple[str, int]) -> tuple[socket.socket, int]:
    """A listening socket bound inside the namespace at NETNS_PATH; returns it and that namespace's inode."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        inode = os.fstat(target).st_ino
        setns(target)
        try:
            server = socket.create_server(address)
        finally:
            setns(own)
    finally:
        os.close(own)
        os.close(target)
    return server, inode


def namespace_alive(netns_path: str, inode: int) -> bool:
    try:
        return os.stat(netns_path).st_ino == inode
    except OSError:
        return False


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(BUFFER_BYTES)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)  # pass the half-close on (HTTP clients rely on it)
        except OSError:
            pass


def relay(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
    except OSError:
        client.close()  # the registry is down: the rig sees a closed connection, as it would without us
        return
    upstream.settimeout(None)
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def watch(netns_path: str, inode: int) -> None:
    while namespace_alive(netns_path, inode):
        time.sleep(WATCH_INTERVAL_S)
    print(f"forwarder: {netns_path} is gone, exiting", flush=True)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-netns", required=True, help="network namespace file of the listening side")
    parser.add_argument("--listen", type=parse_address, required=True, help="HOST:PORT inside that namespace")
    parser.add_argument("--connect", type=parse_address, required=True, help="HOST:PORT in this namespace")
    args = parser.parse_args(argv)
    server, inode = listen_in_netns(args.listen_netns, args.listen)
    threading.Thread(target=watch, args=(args.listen_netns, inode), daemon=True).start()
    print(
        f"forwarder: {args.listen_netns} {args.listen[0]}:{args.listen[1]} -> {args.connect[0]}:{args.connect[1]}",
        flush=True,
    )
    while True:
        client, _ = server.accept()
        threading.Thread(target=relay, args=(client, args.connect), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
