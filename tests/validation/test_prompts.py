"""Salted prompts: the salt first, a body that follows the seed, unique session ids."""

from rigkit.validation.prompts import PromptSpec, draft_text, missed_by_its_own_lookup, new_session_id


def test_prompt_starts_with_the_salt_and_body_follows_the_seed():
    spec = PromptSpec("narrative", 500, seed=42)
    a = draft_text(spec, "aaaa", 2000)
    b = draft_text(spec, "bbbb", 2000)
    assert a.startswith("Session aaaa.") and b.startswith("Session bbbb.")
    # same seed: same body after the salt (replayable); the salt alone makes the prefixes differ
    assert a.split("\n\n", 1)[1] == b.split("\n\n", 1)[1]
    other = draft_text(PromptSpec("narrative", 500, seed=43), "aaaa", 2000)
    assert other != a


def test_code_prompts_look_like_code_and_reach_the_size():
    text = draft_text(PromptSpec("code", 500, seed=1), "s", 3000)
    assert "def update_" in text and "return" in text
    assert len(text) >= 3000


def test_session_ids_are_unique():
    assert len({new_session_id() for _ in range(100)}) == 100


def test_a_size_one_past_a_block_boundary_is_the_one_the_example_connector_misses():
    # vLLM 0.32's align_to_block_size: store (n-1)//b*b tokens, look up (n-2)//b*b
    def store_key(n, b):
        return (n - 1) // b * b

    def lookup_key(n, b):
        return (n - 2) // b * b

    for block in (16, 128):
        for tokens in range(2, 3 * block + 3):
            missed = store_key(tokens, block) != lookup_key(tokens, block)
            assert missed_by_its_own_lookup(tokens, block) == missed, (tokens, block)
    assert not missed_by_its_own_lookup(129, None)  # block size unknown: nothing to avoid
