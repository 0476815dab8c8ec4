"""The story's rig (group_data/dual_3090_qwen36.py): one dual-RTX-3090 box, L2 on its NVMe.

A documentation address (192.0.2.0/24) and a placeholder by-id path: put in your own, then

    pyinfra -y inventory/dual_3090_qwen36.py deploy.py

Every host here is in the group dual_3090_qwen36 (this file's name), whose data is that group file.
"""

hosts = [
    (
        "rig-qwen36",
        {
            "ssh_hostname": "192.0.2.21",
            "ssh_user": "rigkit",
            "_sudo": True,
            # the story's L2 partition (/dev/nvme0n1p2), by id: a /dev/nvme name can change between boots
            "l2_device": "/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_2TB_S7DNNJ0W000002B-part2",
        },
    ),
]
