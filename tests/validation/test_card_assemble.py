"""rigkit.validation.card.assemble: a recorded card read back as the validation data that replays its prompts.

The card to_card assembles from a measured run is checked in tests/validation/test_procedure.py (validate_tiers on recorded
/metrics) and tests/validation/test_spec_decode.py.
"""

from card_samples import make_card

from rigkit.validation.card.assemble import replay_data
from rigkit.validation.card.store import write_card
from rigkit.validation.procedure import ValidationSettings


def test_replay_repeats_the_recorded_prompts(tmp_path):
    card = make_card(seed=4242)
    card.repro.output_tokens = 32
    write_card(tmp_path, card)
    settings = ValidationSettings.from_data(replay_data(tmp_path))
    assert (settings.prompt_tokens, settings.prompt_kind, settings.seed, settings.sessions, settings.output_tokens) == (
        3500,
        "narrative",
        4242,
        1,
        32,
    )
