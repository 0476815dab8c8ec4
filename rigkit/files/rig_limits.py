#!/usr/bin/env python3
"""Runs ON the rig: the rig's own limits a cache tier can reach, measured the way the tier moves its bytes.

    python3 rig_limits.py [--gpu] [--block-bytes N] [--blocks N] [--l2-dir DIR --file-bytes N --threads 1,16]

Prints one JSON object:
- "gpus": each GPU's name and PCIe link (nvidia-smi), and with --gpu its host-to-device rates in bytes/s from pinned
  and from pageable host memory, each two ways: "bulk" (one copy of every block at once: the link) and "blocks" (one
  copy per block of --block-bytes, --blocks of them per transfer: as an offload connector moves a session).
- "disk": the L2 directory's device and filesystem, and per (file size, threads, O_DIRECT) the read rate of files
  this probe wrote there first, fsynced, then dropped from the page cache (posix_fadvise DONTNEED) or read with
  O_DIRECT: the disk, never the page cache; at most 1/FREE_SPACE_SHARE of the free space is written
  ("bytes_capped_to" says when that cut --disk-bytes). Its files are removed before it exits.
- "no_gpu": why there is no GPU to measure (no nvidia-smi, none listed, torch sees no CUDA device), else null: a
  machine without a GPU (the lab's CPU rigs) is a finding, not an error.
- "errors": what could not be measured, and why.

Standard library only for the disk half (a rig has python3, nothing more is promised); the GPU half runs where torch
is (the serving image's python, inside the container) and loads it only when --gpu asks for it.
"""

import argparse
import concurrent.futures
import csv
import importlib
import io
import json
import mmap
import os
import subprocess
import sys
import time

# nvidia-smi's names for what the card shows of each GPU (rigkit.nvidia_smi reads the same fields for health)
GPU_FIELDS = (
    "index",
    "name",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)
GPU_KEYS = ("index", "name", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")
GPU_QUERY = ["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]
# O_DIRECT wants buffers, offsets and sizes aligned to the logical block: a page covers every disk rigkit meets
DIRECT_ALIGN = 4096
# Each probe file is written from this much random data, repeated (os.urandom of a whole 36 MiB chunk is slow)
PATTERN_BYTES = 1 << 20
FILE_PREFIX = "rigkit-rig-limits-"
# The disk half writes at most this fraction of the filesystem's free space (1/4): a small store disk (the lab's is
# 1 GiB) keeps room for the tier, and the L2 janitor's free-space floor is never crossed by the probe.
FREE_SPACE_SHARE = 4


def parse_gpu_identity(text):
    """GPU_QUERY's answer -> one dict per GPU (GPU_KEYS); a field nvidia-smi cannot read ("[N/A]") is None."""
    gpus = []
    for row in csv.reader(io.StringIO(text.strip()), skipinitialspace=True):
        if len(row) != len(GPU_KEYS):
            continue
        cells = [cell.strip() for cell in row]
        gpu = {}
        for key, cell in zip(GPU_KEYS, cells):
            if key == "name":
                gpu[key] = cell
            else:
                gpu[key] = int(cell) if cell.isdigit() else None
        gpus.append(gpu)
    return gpus


def gpu_identity(errors):
    """(GPUs nvidia-smi lists, why there is no GPU or None)."""
    try:
        done = subprocess.run(GPU_QUERY, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return [], "no nvidia-smi on this machine"
    except (OSError, subprocess.TimeoutExpired) as exc:
        errors.append(f"nvidia-smi: {exc}")
        return [], None
    if done.returncode != 0:
        errors.append(f"nvidia-smi exit {done.returncode}: {(done.stdout + done.stderr).strip()[:200]}")
        return [], None
    gpus = parse_gpu_identity(done.stdout)
    return gpus, None if gpus else "nvidia-smi lists no GPU"


def rate(nbytes, seconds):
    """Bytes per second; None when nothing measurable was timed."""
    return nbytes / seconds if seconds > 0 else None


def timed_rate(torch, device, transfer, nbytes, repeats):
    """Bytes/s of `repeats` runs of `transfer` (after one warm-up: the copy engine's first use, the driver's
    staging buffers), timed to the last copy's end on `device`."""
    transfer()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        transfer()
    torch.cuda.synchronize(device)
    return rate(nbytes * repeats, time.perf_counter() - start)


def h2d_rates(torch, device, block_bytes, blocks, repeats):
    """{"pinned"|"pageable": {"bulk": bytes/s, "blocks": bytes/s}} for host-to-device copies to `device`: one copy
    of every block at once, and one copy per block (Python launches each: below ~256 KiB a block's figure is bound
    by the launch, not the link)."""
    out = {}
    for memory in ("pinned", "pageable"):
        host = torch.empty((blocks, block_bytes), dtype=torch.uint8, pin_memory=memory == "pinned")
        host.fill_(1)  # touch every page: a first copy must not pay the page faults
        gpu = torch.empty((blocks, block_bytes), dtype=torch.uint8, device=device)
        total = blocks * block_bytes
        out[memory] = {
            "bulk": timed_rate(torch, device, lambda: gpu.copy_(host, non_blocking=True), total, repeats),
            "blocks": timed_rate(
                torch,
                device,
                lambda: [gpu[i].copy_(host[i], non_blocking=True) for i in range(blocks)],
                total,
                repeats,
            ),
        }
    return out


def measure_gpus(gpus, block_bytes, blocks, repeats, errors):
    """Host-to-device rates into each GPU's dict; returns why there is no GPU to measure, or None."""
    try:
        # the image's torch, where this runs with --gpu; a rig's bare python3 never reaches this line
        torch = importlib.import_module("torch")
    except ImportError as exc:
        errors.append(f"torch: {exc} (run the GPU half with the serving image's python)")
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return "torch sees no CUDA device"  # a CPU build (the lab's): nothing to time, and no error either
    if not gpus:
        gpus.extend({"index": i, "name": torch.cuda.get_device_name(i)} for i in range(count))
    for gpu in gpus:
        index = gpu.get("index")
        if index is None or index >= count:
            errors.append(f"GPU {index}: torch sees {count} GPUs")
            continue
        try:
            gpu["h2d"] = h2d_rates(torch, torch.device("cuda", index), block_bytes, blocks, repeats)
            gpu["block_bytes"], gpu["blocks"], gpu["repeats"] = block_bytes, blocks, repeats
        except RuntimeError as exc:
            errors.append(f"GPU {index}: {exc}")
    return None


def mount_of(path, mounts_text):
    """(device, filesystem type, mount point) of the longest mount point holding `path`, from /proc/mounts text."""
    best = (None, None, "")
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # /proc/mounts escapes spaces and the like as octal (\040)
        point = fields[1].encode().decode("unicode_escape")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[2]):
            best = (fields[0], fields[2], point)
    return best


def write_probe_files(directory, file_bytes, files):
    """`files` files of `file_bytes` each, fsynced and dropped from the page cache (clean pages go at DONTNEED)."""
    pattern = os.urandom(min(PATTERN_BYTES, file_bytes))
    paths = []
    for i in range(files):
        path = os.path.join(directory, f"{FILE_PREFIX}{os.getpid()}-{file_bytes}-{i}.bin")
        with open(path, "wb") as f:
            left = file_bytes
            while left > 0:
                piece = pattern[: min(left, len(pattern))]
                f.write(piece)
                left -= len(piece)
            f.flush()
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        paths.append(path)
    return paths


def read_whole(path, o_direct, file_bytes):
    """Read one file whole, as the tier reads one block or chunk; returns the bytes read."""
    flags = os.O_RDONLY | (os.O_DIRECT if o_direct else 0)
    fd = os.open(path, flags)
    try:
        if not o_direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # another thread's readahead must not serve it
        size = -(-file_bytes // DIRECT_ALIGN) * DIRECT_ALIGN
        buffer = mmap.mmap(-1, size)  # anonymous maps are page-aligned, as O_DIRECT needs
        try:
            view, done = memoryview(buffer), 0
            # one read per file as the tier does; a short read (only at the end of the file under O_DIRECT) goes on
            # at an aligned offset of the same buffer
            while done < file_bytes:
                got = os.preadv(fd, [view[done:]], done)
                if got <= 0:
                    break
                done += got
            view.release()
            return done
        finally:
            buffer.close()
    finally:
        os.close(fd)


def disk_read(paths, threads, o_direct, file_bytes):
    """(bytes/s, seconds) reading every path whole with `threads` threads."""
    for path in paths:  # what an earlier pass read is cached again: drop it before this one
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(lambda p: read_whole(p, o_direct, file_bytes), paths))
    seconds = time.perf_counter() - start
    return rate(total, seconds), seconds, total


def measure_disk(directory, file_sizes, threads_list, total_bytes, o_direct_modes, errors):
    try:
        with open("/proc/mounts") as f:
            device, fstype, point = mount_of(os.path.realpath(directory), f.read())
    except OSError:
        device = fstype = point = None
    disk = {"path": directory, "device": device, "filesystem": fstype, "mount_point": point, "reads": []}
    try:
        stats = os.statvfs(directory)
        # the tier and its janitor share this filesystem: the probe never takes more than a share of its free space
        room = stats.f_bavail * stats.f_frsize // FREE_SPACE_SHARE
    except OSError as exc:
        errors.append(f"disk: {directory}: {exc}")
        return disk
    if room < total_bytes:
        disk["bytes_capped_to"] = room
        total_bytes = room
    for file_bytes in file_sizes:
        if total_bytes < file_bytes:
            errors.append(f"disk: under {file_bytes} bytes free to write in {directory} (1/{FREE_SPACE_SHARE} of free)")
            continue
        files = max(1, total_bytes // file_bytes)
        try:
            paths = write_probe_files(directory, file_bytes, files)
        except OSError as exc:
            errors.append(f"disk: writing {files} x {file_bytes} bytes in {directory}: {exc}")
            continue
        try:
            for o_direct in o_direct_modes:
                for threads in threads_list:
                    try:
                        per_s, seconds, total = disk_read(paths, threads, o_direct, file_bytes)
                    except OSError as exc:  # tmpfs and some others refuse O_DIRECT (EINVAL)
                        errors.append(f"disk: O_DIRECT={o_direct} threads={threads}: {exc}")
                        continue
                    disk["reads"].append(
                        {
                            "file_bytes": file_bytes,
                            "files": files,
                            "threads": threads,
                            "o_direct": o_direct,
                            "bytes": total,
                            "seconds": seconds,
                            "bytes_per_s": per_s,
                        }
                    )
        finally:
            for path in paths:
                os.unlink(path)
    return disk


def int_list(text):
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="measure host-to-device rates (needs torch)")
    parser.add_argument("--block-bytes", type=int, default=16 * 147456, help="bytes of one offloaded block")
    parser.add_argument("--blocks", type=int, default=256, help="blocks per transfer")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--l2-dir", help="the L2 tier's directory (the disk half is skipped without it)")
    parser.add_argument("--file-bytes", type=int_list, default=[16 * 147456], help="file sizes the tier reads, a,b")
    parser.add_argument("--threads", type=int_list, default=[1, 16], help="reader threads to try, a,b")
    parser.add_argument("--disk-bytes", type=int, default=1 << 30, help="bytes written and read per file size")
    parser.add_argument("--o-direct", choices=["yes", "no", "both"], default="both")
    args = parser.parse_args(argv)
    errors = []
    gpus, no_gpu = gpu_identity(errors)
    if args.gpu:
        # torch's view decides where it loads: a container may see its GPUs without nvidia-smi (measure_gpus then
        # lists them), and a CPU build sees none
        torch_says = measure_gpus(gpus, args.block_bytes, args.blocks, args.repeats, errors)
        no_gpu = torch_says or (None if gpus else no_gpu)
    out = {"gpus": gpus, "no_gpu": no_gpu, "disk": None, "errors": errors}
    if args.l2_dir:
        modes = {"yes": [True], "no": [False], "both": [True, False]}[args.o_direct]
        out["disk"] = measure_disk(args.l2_dir, args.file_bytes, args.threads, args.disk_bytes, modes, errors)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
