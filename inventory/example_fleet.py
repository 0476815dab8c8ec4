"""A worked example of a real fleet: two dual-RTX-3090 rigs and one 4-GPU rig.

The addresses are documentation addresses (192.0.2.0/24) and the digest in
group_data/example_fleet.py is a placeholder: copy these files, put in your hosts, your NVMe
by-id paths and the digest `rigkit resolve lmcache/vllm-openai:<tag>` prints, then

    pyinfra -y inventory/example_fleet.py deploy.py

Groups: example_dual_3090 and example_quad_gpu (sizes per group in group_data/example_dual_3090.py
and group_data/example_quad_gpu.py); every host is also in example_fleet, this file's name, whose
fleet-wide data is group_data/example_fleet.py. Per host: the SSH address and the L2 NVMe, always by
/dev/disk/by-id/ (a /dev/nvmeXn1 name can change between boots).
"""

example_dual_3090 = [
    (
        "rig-a",
        {"ssh_hostname": "192.0.2.11", "l2_device": "/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_2TB_S7DNNJ0W000001A"},
    ),
    ("rig-b", {"ssh_hostname": "192.0.2.12", "l2_device": "/dev/disk/by-id/nvme-WD_BLACK_SN850X_2000GB_230000000001"}),
]

example_quad_gpu = [
    (
        "rig-c",
        {"ssh_hostname": "192.0.2.13", "l2_device": "/dev/disk/by-id/nvme-SAMSUNG_MZQL23T8HCLS-00A07_S64HNE0T000001"},
    ),
]
