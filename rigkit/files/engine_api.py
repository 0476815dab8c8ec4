"""The serving stack's view of the docker engine, read from its API on the local socket in one process.

Run on the rig as ``python3 -I -S -c <this text> SECTION_END IMAGE LABEL`` by rigkit.facts.serving.ServingEngine:
one short process instead of five docker CLI calls (each costs a rig ~20 ms of CPU before it says anything).
Prints ``SECTION_END api``, then the engine's own answers, each followed by SECTION_END: its version (the
``Server`` header of its answers, else ``GET /version``), ``GET /images/json``, "present" or "absent" for IMAGE
(nothing when IMAGE is ""), and the inspect JSON of every container carrying LABEL; the controller reads them
(rigkit.facts.serving.engine_parts). Prints nothing and
exits non-zero when the CLI would not use a unix socket (a TCP or SSH DOCKER_HOST, a context), the socket does
not answer, or the engine answers something this script does not read: the fact then runs the docker CLI.

Only ``os`` and the C socket module are imported: ``json`` (it loads ``re``) and ``socket`` (``enum``,
``selectors``) would double the process's CPU, which a rig spends twice per deploy. ``GET /version`` alone costs
the engine more than the rest together (it asks containerd, runc and docker-init for theirs): the version every
answer's header carries is read instead.
"""

import os
import sys
from _socket import AF_UNIX, SOCK_STREAM, socket

DEFAULT_SOCKET = "/var/run/docker.sock"
ID_KEY = b'"Id"'
SERVER_PREFIX = b"Docker/"


def engine_socket():
    """The unix socket the docker CLI would use, else None (a TCP or SSH host, a context other than default).
    The CLI's order (docker/cli cli/command/cli.go, resolveContextName): DOCKER_HOST, then DOCKER_CONTEXT,
    then the config's currentContext."""
    host = os.environ.get("DOCKER_HOST")
    if host:
        return host[len("unix://") :] if host.startswith("unix://") else None
    context = os.environ.get("DOCKER_CONTEXT")
    if not context:
        config = os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json")
        try:
            with open(config, "rb") as file:
                text = file.read()
        except FileNotFoundError:
            text = b""
        if b"currentContext" in text:  # only then is the config's JSON worth json's import
            import json

            context = json.loads(text).get("currentContext")
    return DEFAULT_SOCKET if context in (None, "", "default") else None


def quote(text):
    """Percent-encoding for a URL path or query (urllib.parse would double this script's start-up time)."""
    return "".join(chr(b) if b < 128 and (chr(b).isalnum() or chr(b) in "-._~/:@") else f"%{b:02X}" for b in text.encode())


def get(engine, path, allowed=(200,)):
    connection = socket(AF_UNIX, SOCK_STREAM)
    try:
        connection.settimeout(30)
        connection.connect(engine)
        # HTTP/1.0: the engine answers unchunked and closes the connection when done
        connection.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    finally:
        connection.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *headers = head.split(b"\r\n")
    status = int(status_line.split(None, 2)[1])
    if status not in allowed:
        raise SystemExit(3)
    return status, body.strip(), headers


def server_header(headers):
    """The engine's ``Server`` header when it is Docker's ("Docker/VERSION (OS)", set on every answer by moby's
    api/server/middleware/version.go), else None."""
    for header in headers:
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"server" and value.strip().startswith(SERVER_PREFIX):
            return value.strip()
    return None


def container_ids(listing):
    """The ids in ``GET /containers/json``'s answer: each container's "Id" key (a string "Id" elsewhere is a
    value, or escaped inside a longer string). An answer laid out otherwise ends the script."""
    ids, at = [], listing.find(ID_KEY)
    while at >= 0:
        at += len(ID_KEY)
        rest = listing[at:].lstrip()
        if rest[:1] == b":":  # a key, not a value
            ident = rest[1:].lstrip()[:66]
            if len(ident) != 66 or ident[::65] != b'""' or ident[1:65].strip(b"0123456789abcdef"):
                raise SystemExit(4)
            ids.append(ident[1:65].decode())
        at = listing.find(ID_KEY, at)
    if not ids and listing not in (b"[]", b"null"):
        raise SystemExit(4)
    return ids


def sections(engine, image, label):
    _, images, headers = get(engine, "/images/json")
    server = server_header(headers)
    yield [server] if server else [get(engine, "/version")[1]]
    yield [images]
    if image:
        status, _, _ = get(engine, f"/images/{quote(image)}/json", allowed=(200, 404))
        yield [b"present" if status == 200 else b"absent"]
    else:
        yield []
    filters = quote('{"label":["' + label.replace("\\", "\\\\").replace('"', '\\"') + '"]}')
    listed = get(engine, f"/containers/json?all=1&filters={filters}")[1]
    yield [get(engine, f"/containers/{each}/json")[1] for each in container_ids(listed)]


def main(section_end, image, label):
    engine = engine_socket()
    if engine is None:
        return 2
    end = section_end.encode()
    lines = [end + b" api", *(line for section in sections(engine, image, label) for line in [*section, end])]
    sys.stdout.buffer.write(b"\n".join(lines) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
