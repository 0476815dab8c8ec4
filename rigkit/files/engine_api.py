"""The serving stack's view of the docker engine, read from its API on the local socket in one process.

Run on the rig as ``python3 -I -S -c <this text> SECTION_END IMAGE LABEL`` by rigkit.facts.serving.ServingEngine:
one short process instead of five docker CLI calls (each costs a rig ~20 ms of CPU before it says anything).
Prints, each followed by SECTION_END, what these would print: ``docker info --format '{{.ServerVersion}}'``
(then "exit=0"), ``docker image ls --format '{{.Repository}}:{{.Tag}}'`` (tagged images, newest image
first), ``docker image inspect IMAGE`` ("present" or "absent"; nothing when IMAGE is ""), and the inspect
JSON of every container carrying LABEL. Prints nothing and exits non-zero when the CLI would not use a unix
socket (a TCP or SSH DOCKER_HOST, a context), the socket does not answer, or the engine answers something
this script does not read: the fact then runs the docker CLI itself.
"""

import json
import os
import socket
import sys

DEFAULT_SOCKET = "/var/run/docker.sock"


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
            with open(config) as file:
                context = json.load(file).get("currentContext")
        except FileNotFoundError:
            pass
    return DEFAULT_SOCKET if context in (None, "", "default") else None


def quote(text):
    """Percent-encoding for a URL path or query (urllib.parse would double this script's start-up time)."""
    return "".join(chr(b) if b < 128 and (chr(b).isalnum() or chr(b) in "-._~/:@") else f"%{b:02X}" for b in text.encode())


def get(engine, path, allowed=(200,)):
    with socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(30)
        connection.connect(engine)
        # HTTP/1.0: the engine answers unchunked and closes the connection when done
        connection.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(None, 2)[1])
    if status not in allowed:
        raise SystemExit(3)
    return status, body


def sections(engine, image, label):
    yield [json.loads(get(engine, "/version")[1])["Version"], "exit=0"]
    images = json.loads(get(engine, "/images/json")[1])
    yield [tag for each in images for tag in each.get("RepoTags") or []]  # DockerLocalImages drops "<none>"
    if image:
        status, _ = get(engine, f"/images/{quote(image)}/json", allowed=(200, 404))
        yield ["present" if status == 200 else "absent"]
    else:
        yield []
    filters = quote(json.dumps({"label": [label]}))
    listed = json.loads(get(engine, f"/containers/json?all=1&filters={filters}")[1])
    yield [json.dumps([json.loads(get(engine, f"/containers/{each['Id']}/json")[1]) for each in listed])]


def main(section_end, image, label):
    engine = engine_socket()
    if engine is None:
        return 2
    lines = [line for section in sections(engine, image, label) for line in [*section, section_end]]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
