"""The local lab's rigs: the cpu-lab profile, release 1 of the lab's serving image, the lab's model staged, no GPUs.

The image digest comes from the lab state (lab digests change with every cold build);
`--data serving_image=<repo@sha256:...>` deploys another release. pyinfra loads every group_data
file for every inventory, so this one must load without a lab too. (Only imported names and
settings at module level: pyinfra turns every other name into host data.)
"""

from rigkit.lab.rigs import LAB_MODEL_STORE as _LAB_MODEL_STORE
from rigkit.lab.state import pinned_model_source, release_image

serving_profile = "cpu-lab"
serving_image = release_image("1")
# the lab's trained model, pinned by `rigkit lab up`: every deploy stages it onto the rig and mounts it read-only
model_source = pinned_model_source()
# on the rig's own disk, not the default (the NVMe): rigkit.lab.rigs.LAB_MODEL_STORE says why
model_store_path = _LAB_MODEL_STORE
gpus = 0
# Debian's docker.io + docker-compose v1, as the lab rigs carry; the rig engine must never
# create a bridge on the shared host network.
docker_source = "distro"
docker_daemon_options = {"bridge": "none", "iptables": False, "ip-forward": False, "ip-masq": False}
# A small KV pool (72 blocks x 128 tokens = 9,216 >= max_model_len) so validation can evict a prefix
# from the "GPU" pool with a few filler requests and prove the connector tier (lab.md).
num_gpu_blocks_override = 72
