"""Train the lab's tiny Qwen3 on a fixed corpus and write it as a servable model directory.

Usage: python train_model.py MODEL_DIR CORPUS_JSONL EVAL_JSONL

Runs in its own venv (torch, transformers, tokenizers, safetensors: rigkit/lab/lab_model.py pins and makes it),
on the CPU, in a few minutes. Writes into MODEL_DIR: the tokenizer (train_tokenizer.py, next to config.json),
config.json + model.safetensors (bf16, as served) and training.json (loss curve, seconds, and the margins: the
top-1 minus top-2 logprob of every greedy token after each held-out prompt, computed in bf16 as vLLM serves it).

Why train at all: vLLM's dummy weights give the same tokens for every prompt and random weights give nearly flat
next-token distributions (top-2 within one bf16 step), so a served-but-wrong check compares noise. A model
trained on the text the validation prompts are made of predicts most tokens with a wide margin, so a differing
token is either a near tie (numerics) or wrong KV.

Deterministic: fixed seeds, a fixed thread count, deterministic algorithms; the same inputs on the same machine
give the same bytes (rigkit caches the directory by its inputs).
"""

import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_tokenizer  # noqa: E402  (next to this script, in the same sources directory)

SEED = 20261203
THREADS = 2
SEQUENCE_TOKENS = 512
BATCH_SEQUENCES = 8
STEPS = 240
LEARNING_RATE = 3e-3
WARMUP_STEPS = 20
WEIGHT_DECAY = 0.01
EVAL_OUTPUT_TOKENS = 16
EVAL_TOP = 5
LOG_EVERY = 20


def token_stream(tokenizer, corpus: Path) -> torch.Tensor:
    ids: list[int] = []
    for line in corpus.read_text().splitlines():
        ids += tokenizer.encode(json.loads(line)["text"]) + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def batches(stream: torch.Tensor, generator: torch.Generator):
    windows = stream[: len(stream) // SEQUENCE_TOKENS * SEQUENCE_TOKENS].view(-1, SEQUENCE_TOKENS)
    while True:
        for start in range(0, len(windows) - BATCH_SEQUENCES + 1, BATCH_SEQUENCES):
            order = torch.randperm(len(windows), generator=generator) if start == 0 else order
            yield windows[order[start:start + BATCH_SEQUENCES]]


def learning_rate(step: int) -> float:
    if step < WARMUP_STEPS:
        return LEARNING_RATE * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, STEPS - WARMUP_STEPS)
    return LEARNING_RATE * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, stream: torch.Tensor) -> list[float]:
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    losses, started = [], time.monotonic()
    model.train()
    for step, batch in zip(range(STEPS), batches(stream, generator)):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(round(loss.item(), 4))
        if step % LOG_EVERY == 0 or step == STEPS - 1:
            print(f"model: step {step + 1}/{STEPS} loss {loss.item():.3f} ({time.monotonic() - started:.0f} s)",
                  flush=True)
    return losses


@torch.no_grad()
def greedy_margins(model, tokenizer, prompt: str) -> dict:
    """Greedy decode EVAL_OUTPUT_TOKENS after `prompt` (with a KV cache, as served); per token: top-1 minus top-2
    logprob (nats)."""
    ids = torch.tensor([tokenizer.encode(prompt)])
    margins, chosen = [], []
    output = model(input_ids=ids, use_cache=True)
    for _ in range(EVAL_OUTPUT_TOKENS):
        logprobs = torch.log_softmax(output.logits[0, -1].float(), dim=-1)
        top = torch.topk(logprobs, EVAL_TOP)
        margins.append(round((top.values[0] - top.values[1]).item(), 4))
        chosen.append(int(top.indices[0]))
        output = model(input_ids=top.indices[:1].view(1, 1), past_key_values=output.past_key_values, use_cache=True)
    return {"prompt_tokens": ids.shape[1], "text": tokenizer.decode(chosen), "margins": margins}


def evaluate(model, tokenizer, eval_prompts: Path) -> list[dict]:
    return [dict(kind=json.loads(line)["kind"], **greedy_margins(model, tokenizer, json.loads(line)["text"]))
            for line in eval_prompts.read_text().splitlines()]


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"tokens": len(ordered), "min": ordered[0], "p10": ordered[len(ordered) // 10],
            "median": ordered[len(ordered) // 2], "below_0.5": sum(v < 0.5 for v in ordered),
            "below_0.1": sum(v < 0.1 for v in ordered)}


def main(model_dir: Path, corpus: Path, eval_prompts: Path) -> None:
    torch.manual_seed(SEED)
    random.seed(SEED)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    sources = Path(__file__).resolve().parent
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sources / "config.json", model_dir / "config.json")  # the tokenizer's check reads it
    train_tokenizer.main(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = Qwen3Config(**json.loads((sources / "config.json").read_text()))
    model = Qwen3ForCausalLM(config).float()
    stream = token_stream(tokenizer, corpus)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, corpus {len(stream):,} tokens, "
          f"{STEPS} steps x {BATCH_SEQUENCES} x {SEQUENCE_TOKENS} tokens", flush=True)
    started = time.monotonic()
    losses = train(model, stream)
    seconds = time.monotonic() - started
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    # what vLLM will read: the saved bf16 tensors, not the in-memory model
    model.load_state_dict(load_file(model_dir / "model.safetensors"), strict=False)
    evaluated = evaluate(model, tokenizer, eval_prompts)
    margins = [m for e in evaluated for m in e["margins"]]
    record = {"steps": STEPS, "sequence_tokens": SEQUENCE_TOKENS, "batch_sequences": BATCH_SEQUENCES,
              "seconds": round(seconds, 1), "final_loss": losses[-1], "losses": losses[::LOG_EVERY],
              "margins": summary(margins), "eval": evaluated,
              "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}
    (model_dir / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"model: trained in {seconds:.0f} s, final loss {losses[-1]:.3f}; greedy margins (top-1 minus top-2 "
          f"logprob, bf16) over {len(margins)} tokens: {record['margins']}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
