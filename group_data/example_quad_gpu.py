"""The 4-GPU rig (256 GB RAM, 3.84 TB NVMe): the example fleet's big rig."""

gpus = 4
tensor_parallel_size = 4
l1_size_gb = 160
l2_budget_gb = 3000
serving_port = 8001  # its clients expect another port
