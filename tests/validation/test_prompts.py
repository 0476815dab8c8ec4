"""Salted prompts: the salt first, a body that follows the seed, unique session ids."""

from rigkit.prompts import PromptSpec, draft_text, new_session_id, on_a_block_edge


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


def test_a_block_edge_is_a_size_the_gpu_cache_or_the_example_connector_cannot_serve_as_labelled():
    # vLLM recomputes a prompt's last token: its GPU prefix hits are (n-1)//b*b, and a connector holding the next
    # whole block serves it; vLLM 0.32's ExampleConnector stores (n-1)//b*b tokens and looks up (n-2)//b*b
    def gpu_hits(n, b):
        return (n - 1) // b * b

    def connector_serves_a_block(n, b):
        return gpu_hits(n, b) < n // b * b

    def example_connector_misses(n, b):
        return (n - 1) // b * b != (n - 2) // b * b

    for block in (16, 128):
        for tokens in range(2, 3 * block + 3):
            edge = connector_serves_a_block(tokens, block) or example_connector_misses(tokens, block)
            assert on_a_block_edge(tokens, block) == edge, (tokens, block)
    assert not on_a_block_edge(129, None)  # block size unknown: nothing to avoid
