"""Proving the KV cache: the validation procedure, tier labels from metric deltas, /metrics, TTFT, the greedy oracle,
soak, decode A/B, prompts, the warm-shared pair, and the results cards."""
