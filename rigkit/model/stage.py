"""Stage a pinned model onto a fleet's rigs before the release: fetched once, then rig to rig.

The source is read once: a hub commit is fetched onto the controller (rigkit.model.hub), a controller
directory is read where it is; the controller sends it to ONE rig, and every later rig gets it from a rig
that already holds the verified revision, over SSH (the senders double each round: 1, 2, 4 ... rigs). A rig
already holding the verified, undamaged revision is a no-op. On each rig the files land in the store's
partial directory (resumed at each file's size on a re-run), are verified against the manifest's sha256 (a
bad file is deleted and sent again, never served) and renamed into place (rigkit/files/model_store.py).

Rig to rig, the sending rig runs ``ssh`` to the receiving one with the controller's own key, forwarded
from a private ssh-agent the controller starts for the transfer and ends after it (no key is written on a
rig, no authorized_keys touched), and checks the receiver's host key against the one the controller's
own connection verified. A rig-to-rig transfer that fails falls back to the controller, saying so.

A model on a shared mount (``shared:``) is not copied (``verify_shared``): each rig hashes the files where they
are, the controller matches them to the pin, and the rig's store keeps a stamp naming the directory.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import paramiko
import paramiko.agent

from rigkit.errors import RigkitError
from rigkit.paths import RIG_LIB_DIR
from rigkit.remote.tunnel import connect_ssh, ssh_address
from rigkit.serving.commands import FILES_DIR
from rigkit.serving.ledger import LEDGER_PATH, Ledger
from rigkit.settings.model_source import SHARED_PREFIX, ModelSource, manifest_hash, manifest_size, revisions_to_remove

logger = logging.getLogger("rigkit.model")
STORE_SCRIPT_SOURCE = FILES_DIR / "model_store.py"
STORE_SCRIPT = f"{RIG_LIB_DIR}/model_store.py"
CONTROLLER = "controller"
FIELD = "model_source"
# free space left on the store's filesystem after staging (the L2 tier shares the NVMe)
STORE_MARGIN_BYTES = 1 << 30
FRAME_CHUNK = 1 << 20
BUSY_EXIT = 75
# a transfer that moves no byte for this long is dead (a hung peer), not slow
CHANNEL_IDLE_TIMEOUT_S = 300


def fan_out_rounds(have: list[str], need: list[str]) -> list[list[tuple[str, str]]]:
    """Who sends to whom, round after round: the controller to one rig when no rig has the revision, then
    every rig holding it to one rig lacking it per round. Pure."""
    holders, waiting, rounds = list(have), list(need), []
    if waiting and not holders:
        first = waiting.pop(0)
        rounds.append([(CONTROLLER, first)])
        holders.append(first)
    while waiting:
        pairs = [(sender, waiting.pop(0)) for sender in list(holders) if waiting]
        holders += [receiver for _, receiver in pairs]
        rounds.append(pairs)
    return rounds


@dataclass
class RigOutcome:
    rig: str
    action: str  # "already staged", "from controller", "from <rig>", "refused"
    sent_bytes: int = 0
    note: str = ""


@dataclass
class StageReport:
    source: str
    manifest: str
    outcomes: dict[str, RigOutcome] = field(default_factory=dict)
    source_bytes: int = 0  # bytes the controller sent from its copy of the source

    def as_json(self) -> dict:
        """What `rigkit stage --json` prints per model: every figure of the run, bytes exact."""
        return {
            "source": self.source,
            "manifest": self.manifest,
            "source_bytes": self.source_bytes,
            "outcomes": {
                name: {"action": outcome.action, "sent_bytes": outcome.sent_bytes, "note": outcome.note}
                for name, outcome in self.outcomes.items()
            },
        }

    def lines(self) -> list[str]:
        return [
            f"{name}: {outcome.action}{f' ({outcome.sent_bytes / 1e6:,.1f} MB)' if outcome.sent_bytes else ''}"
            f"{f'; {outcome.note}' if outcome.note else ''}"
            for name, outcome in self.outcomes.items()
        ]


class RigStore:
    """One rig's model store over the controller's SSH connection (the one the inventory describes)."""

    def __init__(self, name: str, data: Mapping, store: str, source: ModelSource):
        self.name, self.data, self.store, self.source = name, data, store, source
        self.client = connect_ssh(data, name)
        self._install_script()

    def close(self) -> None:
        self.client.close()

    def _install_script(self) -> None:
        text = STORE_SCRIPT_SOURCE.read_bytes()
        self.run(
            f"mkdir -p {shlex.quote(RIG_LIB_DIR)} && cat > {shlex.quote(STORE_SCRIPT)}.tmp && "
            f"mv {shlex.quote(STORE_SCRIPT)}.tmp {shlex.quote(STORE_SCRIPT)}",
            stdin=text,
        )

    def command(self, verb: str, *args: str) -> str:
        return " ".join(
            shlex.quote(part)
            for part in ("python3", STORE_SCRIPT, verb, self.store, self.source.slug, self.source.revision, *args)
        )

    def run(
        self,
        command: str,
        stdin: Optional[bytes] = None,
        writer: Optional[Callable] = None,
        progress: Optional[Callable[[str], None]] = None,
        agent: bool = False,
    ) -> tuple[int, str, str]:
        """Run ``command`` on the rig: ``stdin`` bytes, or ``writer(channel)`` streaming them; stderr lines
        to ``progress`` as they come."""
        channel = self.client.get_transport().open_session()
        channel.settimeout(CHANNEL_IDLE_TIMEOUT_S)
        if agent:
            paramiko.agent.AgentRequestHandler(channel)
        channel.exec_command(command)
        stderr: list[str] = []

        def read_stderr() -> None:
            buffered = b""
            while True:
                data = channel.recv_stderr(65536)
                if not data:
                    break
                buffered += data
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    stderr.append(text)
                    if progress and text.startswith("progress "):
                        progress(text)
            if buffered:
                stderr.append(buffered.decode(errors="replace"))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        if writer is not None:
            writer(channel)
        elif stdin is not None:
            channel.sendall(stdin)
        channel.shutdown_write()
        stdout = b""
        while True:
            data = channel.recv(65536)
            if not data:
                break
            stdout += data
        status = channel.recv_exit_status()
        reader.join(timeout=10)
        return (
            status,
            stdout.decode(errors="replace"),
            "\n".join(line for line in stderr if not line.startswith("progress ")),
        )

    def call(self, verb: str, *args: str, stdin: Optional[bytes] = None) -> Any:
        status, out, err = self.run(self.command(verb, *args), stdin=stdin)
        if status == BUSY_EXIT:
            raise RigkitError(
                FIELD,
                self.source.spec,
                f"{self.name}: another staging of this model is running on the rig",
                "wait for it to finish (two controllers staging at once), then run again",
            )
        if status != 0:
            raise RigkitError(
                FIELD,
                self.source.spec,
                f"{self.name}: model store {verb} failed ({err.strip()})",
                "read the error; the partial copy is kept and the next run resumes it",
            )
        return json.loads(out.strip().splitlines()[-1])

    def host_key_line(self) -> str:
        key = self.client.get_transport().get_remote_server_key()
        host, port = ssh_address(self.name, self.data), int(self.data.get("ssh_port") or 22)
        return f"{host if port == 22 else f'[{host}]:{port}'} {key.get_name()} {key.get_base64()}"


def _frames(root: Path, plan: list[dict], count: Callable[[int], None]) -> Callable:
    """A writer streaming the planned files of ``root`` from their offsets, as model_store.py receives them."""

    def write(channel) -> None:
        channel.sendall(f"{sum(item['size'] - item['offset'] for item in plan)}\n".encode())
        for item in plan:
            length = item["size"] - item["offset"]
            channel.sendall(
                (json.dumps({"path": item["path"], "offset": item["offset"], "size": length}) + "\n").encode()
            )
            with open(root / item["path"], "rb") as handle:
                handle.seek(item["offset"])
                left = length
                while left:
                    chunk = handle.read(min(FRAME_CHUNK, left))
                    if not chunk:
                        raise RigkitError(
                            FIELD,
                            str(root / item["path"]),
                            "the source file is shorter than its manifest",
                            "pin the source again (`rigkit resolve-model`)",
                        )
                    channel.sendall(chunk)
                    left -= len(chunk)
                    count(len(chunk))
        channel.sendall(b"\n")

    return write


def transfer_plan(files: Mapping[str, Mapping], partial: Mapping[str, int]) -> list[dict]:
    """Each manifest file not fully on the receiver, from the size it has (a longer file starts over)."""
    plan = []
    for path, entry in sorted(files.items()):
        have = partial.get(path, 0)
        size = int(entry["size"])
        if have != size:
            plan.append({"path": path, "offset": have if have < size else 0, "size": size})
    return plan


@contextmanager
def forwarded_agent(keys: list[str]) -> Iterator[None]:
    """A private ssh-agent holding ``keys`` (the inventory's ssh_key files) for the transfer, ended after it;
    without keys the controller's own agent (SSH_AUTH_SOCK) is forwarded."""
    if not keys:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="rigkit-agent-") as directory:
        socket_path = os.path.join(directory, "agent.sock")
        agent = subprocess.Popen(
            ["ssh-agent", "-D", "-a", socket_path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            for _ in range(100):
                if os.path.exists(socket_path):
                    break
                time.sleep(0.05)
            environment = {**os.environ, "SSH_AUTH_SOCK": socket_path}
            for key in keys:
                subprocess.run(
                    ["ssh-add", "-q", "-t", "3600", os.path.expanduser(key)],
                    env=environment,
                    check=True,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                )
            previous = os.environ.get("SSH_AUTH_SOCK")
            os.environ["SSH_AUTH_SOCK"] = socket_path
            try:
                yield
            finally:
                if previous is None:
                    os.environ.pop("SSH_AUTH_SOCK", None)
                else:
                    os.environ["SSH_AUTH_SOCK"] = previous
        finally:
            agent.terminate()
            agent.wait(timeout=10)


SHARED_ACTION = "verified in place (shared mount, not copied)"


def check_store_mounted(rig: str, store: str, state: Mapping, mount: Optional[str]) -> None:
    """A store under the L2 disk's mount point (``mount``) only once the disk is mounted there (model_store.py
    state's store_mount): on a fresh rig the l2_disk role mounts it, and what was staged before would be hidden under
    the mount. `rigkit deploy` runs that role first (rigkit.fleet.provision); `rigkit stage` alone is refused."""
    if mount and state.get("store_mount") != mount:
        raise RigkitError(
            "model_store_path",
            store,
            f"{rig}: nothing is mounted at {mount} yet (a fresh rig: the l2_disk role mounts the NVMe "
            "there during the deploy), so a copy staged now would be hidden under the mount",
            "run `rigkit deploy` (it runs the roles up to l2_disk on such a rig before it stages), or set "
            "model_store_path to a directory on a disk already mounted",
        )


def verify_shared(
    source: ModelSource,
    rigs: Mapping[str, Mapping],
    stores: Mapping[str, str],
    progress: Callable[[str], None] = logger.warning,
    store_mounts: Optional[Mapping[str, str]] = None,
) -> StageReport:
    """A shared-mount model on each rig: its files there hashed against the pin (a file unchanged since the last
    run by size and mtime is not read again), a stamp written in the rig's store; nothing copied. Refused, naming
    the rig, when the directory is not there or its files are not the pinned ones."""
    files_hash = ""
    report = StageReport(source.spec, source.revision)
    for name, data in rigs.items():
        store = RigStore(name, data, stores[name], source)
        try:
            status, out, err = store.run(
                store.command("hash-dir", source.name), progress=_shared_progress(name, source, progress)
            )
            if status != 0:
                raise RigkitError(
                    FIELD, source.spec, f"{name}: hashing {source.name} failed ({err.strip()})", "read the error"
                )
            found = json.loads(out.strip().splitlines()[-1])
            if not found["exists"]:
                raise RigkitError(
                    FIELD,
                    source.spec,
                    f"{name}: no directory {source.name} on the rig (the share is not mounted there?)",
                    f"mount the share at {source.name} on every rig (fstab), or declare another model_source",
                )
            manifest = {path: {"size": e["size"], "sha256": e["sha256"]} for path, e in found["files"].items()}
            files_hash = manifest_hash(manifest)
            if files_hash != source.revision:
                raise RigkitError(
                    FIELD,
                    source.spec,
                    f"{name}: the files in {source.name} hash to {files_hash}, not the pinned {source.revision}: "
                    "the share changed since it was pinned (or the rig mounts another one)",
                    f"pin what it holds: {SHARED_PREFIX}{source.name}@{files_hash}, after checking the change",
                )
            check_store_mounted(name, stores[name], store.call("state"), (store_mounts or {}).get(name))
            document = {"files": found["files"], "hash": files_hash, "source": source.spec}
            store.call("stamp-shared", source.name, stdin=json.dumps(document).encode())
        finally:
            store.close()
        report.outcomes[name] = RigOutcome(name, SHARED_ACTION)
    return report


def throttled_progress(progress: Callable[[str], None], describe: Callable[[str], str]) -> Callable[[str], None]:
    """A reader of the rig script's `progress DONE TOTAL` lines that shows ``describe("<done> of <total> MB")``
    at most every 2 s, and always the last one."""
    last = [0.0]

    def show(line: str) -> None:
        _, done, total = line.split()
        now = time.monotonic()
        if now - last[0] >= 2 or done == total:
            last[0] = now
            progress(describe(f"{int(done) / 1e6:,.0f} of {int(total) / 1e6:,.0f} MB"))

    return show


def _shared_progress(rig: str, source: ModelSource, progress: Callable[[str], None]) -> Callable[[str], None]:
    return throttled_progress(progress, lambda figures: f"{rig}: hashing {source.name} in place: {figures}")


class FleetStager:
    """Stage ``source`` (its files under ``root``, manifest ``files``) onto ``rigs`` (name -> host data)."""

    def __init__(
        self,
        source: ModelSource,
        root: Path,
        files: Mapping[str, Mapping],
        rigs: Mapping[str, Mapping],
        stores: Mapping[str, str],
        keep: Mapping[str, int],
        progress: Callable[[str], None] = logger.warning,
        rig_to_rig: bool = True,
        store_mounts: Optional[Mapping[str, str]] = None,
    ):
        """``store_mounts``: rig -> the mount point its store must be on (the L2 disk's, when the store is under it)."""
        self.store_mounts = dict(store_mounts or {})
        self.source, self.root, self.files = source, root, dict(files)
        self.rigs, self.stores, self.keep, self.progress = rigs, stores, keep, progress
        self.rig_to_rig = rig_to_rig
        self.hash = manifest_hash(self.files)
        self.total = manifest_size(self.files)
        self.report = StageReport(source.spec, self.hash)
        self.lock = threading.Lock()

    def _progress(self, rig: str, sender: str) -> Callable[[str], None]:
        return throttled_progress(
            self.progress, lambda figures: f"{rig}: model {self.source.slug} from {sender}: {figures}"
        )

    def manifest_document(self) -> bytes:
        return json.dumps({"files": self.files, "hash": self.hash, "source": self.source.spec}).encode()

    def _preflight(self, store: RigStore, state: dict) -> None:
        check_store_mounted(store.name, store.store, state, self.store_mounts.get(store.name))
        have = sum(
            min(size, int(self.files[path]["size"])) for path, size in state["partial"].items() if path in self.files
        )
        needed = self.total - have
        if needed + STORE_MARGIN_BYTES > state["free"]:
            raise RigkitError(
                "model_store_path",
                store.store,
                f"{store.name}: the model needs {needed / 1e9:,.2f} GB "
                f"more (+{STORE_MARGIN_BYTES / 1e9:.0f} GB margin) but the store's filesystem has "
                f"{state['free'] / 1e9:,.2f} GB free",
                "free space there (older revisions: lower "
                "model_store_keep), or point model_store_path at a larger disk",
            )

    def _finish(self, store: RigStore) -> dict:
        return store.call("finish", stdin=self.manifest_document())

    def _from_controller(self, store: RigStore, state: dict) -> int:
        plan = transfer_plan(self.files, state["partial"])
        sent = [0]

        def count(n: int) -> None:
            sent[0] += n

        status, _, err = store.run(
            store.command("receive"),
            writer=_frames(self.root, plan, count),
            progress=self._progress(store.name, CONTROLLER),
        )
        if status != 0:
            raise RigkitError(
                FIELD,
                self.source.spec,
                f"{store.name}: receiving the model failed ({err.strip()})",
                "run again: the files received so far are kept and resumed",
            )
        with self.lock:
            self.report.source_bytes += sent[0]
        return sent[0]

    def _from_rig(self, sender: RigStore, receiver: RigStore, state: dict) -> int:
        plan = transfer_plan(self.files, state["partial"])
        known_hosts = f"{sender.store}/.known_hosts-{receiver.name}-{os.getpid()}"
        sender.run(
            f"mkdir -p {shlex.quote(sender.store)} && cat > {shlex.quote(known_hosts)}",
            stdin=(receiver.host_key_line() + "\n").encode(),
        )
        host = ssh_address(receiver.name, receiver.data)
        ssh = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ConnectTimeout=15",
            "-p",
            str(int(receiver.data.get("ssh_port") or 22)),
            f"{receiver.data.get('ssh_user') or 'root'}@{host}",
            receiver.command("receive"),
        ]
        pipeline = (
            f"{sender.command('send', json.dumps(plan))} | {' '.join(shlex.quote(part) for part in ssh)}; "
            f"status=$?; rm -f {shlex.quote(known_hosts)}; exit $status"
        )
        status, _, err = sender.run(pipeline, progress=self._progress(receiver.name, sender.name), agent=True)
        if status != 0:
            raise RigkitError(
                FIELD,
                self.source.spec,
                f"{receiver.name}: from {sender.name} failed ({err.strip()})",
                f"check that {sender.name} reaches {host} over SSH with the controller's key",
            )
        return sum(item["size"] - item["offset"] for item in plan)

    def _stage_one(self, sender_name: str, receiver: RigStore, stores: Mapping[str, RigStore]) -> None:
        for attempt in (1, 2):
            state = receiver.call("state")
            self._preflight(receiver, state)
            if sender_name == CONTROLLER or not self.rig_to_rig:
                sent, action = self._from_controller(receiver, state), "from controller"
            else:
                try:
                    sent, action = self._from_rig(stores[sender_name], receiver, state), f"from {sender_name}"
                except RigkitError as exc:
                    self.progress(f"{receiver.name}: rig to rig failed ({exc.problem}); sending from the controller")
                    sent = self._from_controller(receiver, receiver.call("state"))
                    action = f"from controller (after {sender_name} failed)"
            result = self._finish(receiver)
            outcome = self.report.outcomes.setdefault(receiver.name, RigOutcome(receiver.name, action))
            outcome.sent_bytes += sent
            outcome.action = action
            if result["ok"]:
                return
            self.progress(
                f"{receiver.name}: {len(result['bad'])} file(s) failed their sha256 and "
                f"{len(result['missing'])} are incomplete: sending them again"
            )
            outcome.note = f"resent {', '.join(result['bad'] + result['missing'])}"
        raise RigkitError(
            FIELD,
            self.source.spec,
            f"{receiver.name}: files still fail their sha256 after a second transfer",
            "check the rig's disk (dmesg) and the sender's copy (`rigkit stage --check`)",
        )

    def stage(self) -> StageReport:
        stores: dict[str, RigStore] = {}
        try:
            for name, data in self.rigs.items():
                stores[name] = RigStore(name, data, self.stores[name], self.source)
            have, need = [], []
            for name, store in stores.items():
                state = store.call("state")
                if state["verified"] == self.hash and not state.get("damaged"):
                    have.append(name)
                    self.report.outcomes[name] = RigOutcome(name, "already staged")
                    continue
                if state["verified"]:
                    reopened = store.call("reopen")
                    self.progress(
                        f"{name}: staged copy damaged ({', '.join(reopened['reopened']) or 'stamp'}): repairing it"
                    )
                self._preflight(store, store.call("state"))
                need.append(name)
            # without rig to rig (the benchmark's baseline), the controller sends to every rig at once
            rounds = fan_out_rounds(have, need) if self.rig_to_rig else [[(CONTROLLER, name) for name in need]]
            rig_to_rig = self.rig_to_rig and any(sender != CONTROLLER for pairs in rounds for sender, _ in pairs)
            keys = sorted({str(data["ssh_key"]) for data in self.rigs.values() if data.get("ssh_key")})
            with forwarded_agent(keys if rig_to_rig else []):
                for pairs in rounds:
                    with ThreadPoolExecutor(max_workers=max(1, len(pairs))) as pool:
                        futures = [
                            pool.submit(self._stage_one, sender, stores[receiver], stores) for sender, receiver in pairs
                        ]
                        for future in futures:
                            future.result()
            for name, store in stores.items():
                self._retain(name, store)
            return self.report
        finally:
            for store in stores.values():
                store.close()

    def _retain(self, name: str, store: RigStore) -> None:
        """Remove staged revisions beyond model_store_keep, never one the rig's ledger still needs."""
        status, ledger_text, _ = store.run(f"cat {shlex.quote(LEDGER_PATH)} 2>/dev/null || true")
        ledger = Ledger.from_json(ledger_text)
        prefix = f"{self.source.spec.rpartition('@')[0]}@"
        needed = [spec[len(prefix) :] for spec in ledger.models_needed(self.keep[name]) if spec.startswith(prefix)]
        newest = [spec[len(prefix) :] for spec in ledger.models_newest_first() if spec.startswith(prefix)]
        staged = store.call("list")
        for revision in revisions_to_remove(staged, newest, needed + [self.source.revision], self.keep[name]):
            store.run(
                " ".join(
                    shlex.quote(part)
                    for part in ("python3", STORE_SCRIPT, "remove", store.store, self.source.slug, revision)
                )
            )
            self.progress(f"{name}: removed staged revision {revision[:12]} (model_store_keep {self.keep[name]})")
