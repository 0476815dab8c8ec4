"""The card's "⑤ Does the tier pay?" section, its plot and the fleet card's rows (rigkit.validation.card.pays)."""

from card_samples import make_card

from rigkit.validation.card import load_cards, render_fleet_markdown, render_rig_markdown, render_run, write_card
from rigkit.validation.pays import CPU_TIER, DISK_TIER, RigLimits, SweepPoint, pays_report

LIMITS = RigLimits.from_probe(
    {
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "pcie_gen": 4,
                "pcie_gen_max": 5,
                "pcie_width": 16,
                "h2d": {"pinned": {"bulk": 55e9, "blocks": 50e9}, "pageable": {"bulk": 19e9}},
                "block_bytes": 2359296,
            }
        ],
        "disk": {
            "path": "/mnt/rigkit-l2",
            "device": "/dev/nvme0n1",
            "filesystem": "ext4",
            "reads": [{"file_bytes": 2359296, "files": 10, "threads": 16, "o_direct": True, "bytes_per_s": 1.65e9}],
        },
    }
)
KV = 147456
SWEEP = [
    SweepPoint(tokens=16000, cold_s=0.591, warm_gpu_s=0.145, tiers={CPU_TIER: 0.200, DISK_TIER: 1.650}),
    SweepPoint(tokens=32000, cold_s=1.389, warm_gpu_s=0.208, tiers={CPU_TIER: 0.308, DISK_TIER: 3.062}),
]


def test_every_card_judges_its_own_tiers_when_no_sweep_ran():
    card = make_card()
    card.rig_limits = LIMITS
    md = render_rig_markdown(card)
    section = md[md.index("## ⑤ Does the tier pay?") :]
    assert "PCIe gen 4 x16 (can run gen 5)" in section and "55.0 GB/s pinned" in section
    assert "KV per token: 28.7 KB" in section
    assert "| Warm — connector tier (after GPU eviction) | 3,500 |" in section
    assert "pays from 4K tokens (the shortest length measured)" in section


def test_a_card_without_limits_still_gives_the_gain():
    md = render_rig_markdown(make_card())
    assert "Rig limits not measured" in md and "| — |" in md


def test_sweep_section_plot_and_fleet(tmp_path):
    card = make_card()
    card.rig_limits = LIMITS
    card.pays = pays_report(SWEEP, KV, LIMITS, "model shape")
    md = render_rig_markdown(card)
    assert "does not pay up to 32K on this rig: needs 4.0 GB/s, the disk gives 1.6 GB/s" in md
    assert "86 % of 55.0 GB/s" in md
    write_card(tmp_path, card)
    written = render_run(tmp_path)
    assert tmp_path / "rig1-pays.png" in written
    reloaded = load_cards(tmp_path)[0]
    assert reloaded.pays == card.pays and reloaded.rig_limits == LIMITS
    fleet = render_fleet_markdown([reloaded, make_card("rig2")])
    assert "## Does the tier pay? (per rig)" in fleet
    assert "| rig1 | 55.0 GB/s | 1.6 GB/s | warm-persistent (disk read) | 100 % at 32K | does not pay" in fleet


def test_no_plot_without_a_sweep(tmp_path):
    write_card(tmp_path, make_card())
    assert not any(p.name.endswith("-pays.png") for p in render_run(tmp_path))
