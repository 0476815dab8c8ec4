"""Fleet-wide data of the example fleet (inventory/example_fleet.py): what every rig shares."""

ssh_user = "rigkit"
_sudo = True

serving_profile = "lmcache-mp"
allow_incubating = True  # lmcache-mp is incubating: this fleet opts in
# Placeholder digest: replace with the output of `rigkit resolve lmcache/vllm-openai:<tag>`.
serving_image = "lmcache/vllm-openai@sha256:" + "0" * 64
model = "Qwen/Qwen3-8B"
served_model_name = "qwen3-8b"
model_size_gb = 17  # bf16 weights: their page cache counts against mem_limit
max_model_len = 131072
l2_enabled = True
nvidia_driver_branch = "580"
# Qwen3-8B KV in bf16: 36 layers x 8 KV heads x 128 dims x (K+V) x 2 bytes, for the capacity line.
kv_bytes_per_token = 147456
