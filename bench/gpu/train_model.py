"""Train the GPU check's test model on the device: the tiny Qwen3 config (hidden 1024, 8 layers, 8 KV heads x 64)
memorises one fixed text of each kind in TRAIN_KINDS (rigkit.prompts: narrative, code; ~4,000 characters each), so its
next-token distributions are peaked (vLLM's dummy weights give the same tokens for every prompt; seeded random ones
are nearly flat, so one bf16 step flips a greedy token: ../shared/gpu/README.md). Saved as model.safetensors beside
the config and tokenizer.

    python3 train_model.py SRC_MODEL_DIR DEST_DIR [SECONDS]

Parameters, from the environment (go.sh passes them through):
  TRAIN_CORPUS  "prompts" (default: the prompt generator's own text, one of each TRAIN_KINDS) or "stdlib": this
                Python's standard library sources, text unlike the generator's (a model not sure of the prompts)
  TRAIN_LOSS    stop once the training loss is under this (default 0.02: memorised); e.g. 1.5 leaves a model unsure of
                most next tokens, the kind of model whose near ties the served-right verdict must not mistake
  TRAIN_SHAPE   JSON overriding the config, e.g. {"num_hidden_layers": 12, "num_key_value_heads": 4,
                "head_dim": 96}: another shape; the trained model's config.json says what it is
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rigkit.prompts import PromptSpec, draft_text  # noqa: E402

SEQ, BATCH, LR = 512, 32, 1e-3
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")


def corpus(name: str) -> str:
    """The text the model memorises (module docstring)."""
    if name == "stdlib":
        import textwrap  # noqa: F401 - a module whose source is in every CPython

        library = Path(textwrap.__file__).parent
        return "".join((library / f).read_text()[:6000] for f in ("textwrap.py", "shlex.py", "fractions.py"))
    kinds = os.environ.get("TRAIN_KINDS", "narrative").split(",")
    return "".join(draft_text(PromptSpec(kind, 0, 20261203), "corpus", 4000).split("\n\n", 1)[1] for kind in kinds)


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    budget = float(sys.argv[3]) if len(sys.argv) > 3 else 90.0
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config-qwen3-8b-shape.json":
            shutil.copy(f, dst / f.name)
    raw = {**json.loads((src / "config.json").read_text()), **json.loads(os.environ.get("TRAIN_SHAPE") or "{}")}
    raw["max_window_layers"] = raw["num_hidden_layers"]
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    config = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype", "dtype")})
    text = corpus(os.environ.get("TRAIN_CORPUS", "prompts"))
    ids = Tokenizer.from_file(str(src / "tokenizer.json")).encode(text).ids
    stream = torch.tensor(ids * (SEQ // len(ids) + 3), device="cuda")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).cuda()  # float32 weights, bf16 compute (autocast), saved as bf16
    optim = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    start, step, loss = time.time(), 0, None
    target_loss = float(os.environ.get("TRAIN_LOSS", "0.02"))
    while time.time() - start < budget:
        offsets = torch.randint(0, len(ids), (BATCH,))
        batch = torch.stack([stream[o : o + SEQ] for o in offsets.tolist()])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        step += 1
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f} ({time.time() - start:.0f} s)", flush=True)
        if loss.item() < target_loss:
            break
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    report = {
        "corpus": os.environ.get("TRAIN_CORPUS", "prompts"),
        "shape": {k: raw[k] for k in SHAPE_KEYS},
        "corpus_tokens": len(ids),
        "steps": step,
        "final_loss": loss.item(),
        "target_loss": target_loss,
        "seconds": time.time() - start,
    }
    (dst / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    print("trained:", report, flush=True)


if __name__ == "__main__":
    main()
