"""Dual RTX 3090 rigs (24 GB each, 128 GB RAM, 2 TB NVMe): sizes of the example fleet's small rigs."""

gpus = 2
tensor_parallel_size = 2
l1_size_gb = 60  # MemAvailable must stay >= 60 + ram_reserve_gb (28)
l2_budget_gb = 1500
