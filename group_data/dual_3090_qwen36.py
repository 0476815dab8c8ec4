"""The story's rig: dual RTX 3090 (TP=2), Qwen3.6-27B FP8, int8 KV, MTP n=3, 262K context, LMCache L1 60 GB + L2 on NVMe.

Every value is the one the user ran (../shared/reference: the field notes and the discussion); inventory
dual_3090_qwen36.py puts a rig in this group. tests/fleet/test_worked_example.py renders it and compares the engine
command, flag by flag, with the field notes' one.
"""

serving_profile = "lmcache-mp"
allow_incubating = True  # lmcache-mp is incubating: this rig opts in
# Placeholder digest: replace with the output of `rigkit resolve lmcache/vllm-openai:<tag>` (the tag is mutable).
serving_image = "lmcache/vllm-openai@sha256:" + "0" * 64
gpus = 2
tensor_parallel_size = 2
model = "Qwen/Qwen3.6-27B-FP8"  # a pre-quantized checkpoint: vLLM reads fp8 from its config, no quantization knob
served_model_name = "qwen3.6-27b-fp8"
max_model_len = 262144
max_num_batched_tokens = 1584
gpu_memory_utilization = 0.92
kv_cache_dtype = "int8_per_token_head"  # the story's "int8-PTH"
mamba_cache_mode = "align"
speculative_config = {"method": "mtp", "num_speculative_tokens": 3}
# The cache tiers: L1 60 GB needed mem_limit 110g (pinned L1 + the weights' page cache + headroom).
l1_size_gb = 60
chunk_size = 1584
l2_enabled = True
mem_limit_gb = 110
model_size_gb = 30
kv_bytes_per_token = 131000  # measured: LMCache stores ~131 KB/token in both tiers, whatever the GPU's KV dtype
# The model card's gated-attention layers (16 of 64 layers keep a KV cache, 4 KV heads of 256): with the int8
# KV cache and TP=2 they give the GPU KV per token, which sets the longest context, not the cache size.
model_attention_layers = 16
model_kv_heads = 4
model_head_dim = 256
