"""Train the tiny model's byte-level BPE tokenizer and write it next to config.json.

Runs inside the image build with the venv's `tokenizers`/`transformers`, so the host needs nothing.
The corpus is generated from a fixed seed: the same inputs give the same tokenizer.
Usage: python train_tokenizer.py MODEL_DIR
"""

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 2048
# Order fixes the ids, which config.json relies on: bos/pad 0, eos 2.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS_SEED = 20250520
CORPUS_LINES = 20000

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her all she there would their we him been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come since "
    "against go came right used take three cache prefix token model serve request latency memory disk tier rig "
    "deploy image registry digest rollback upgrade health metric engine block evict prompt stream"
).split()


def corpus(seed: int = CORPUS_SEED, lines: int = CORPUS_LINES):
    rng = random.Random(seed)
    for index in range(lines):
        kind = index % 4
        if kind == 0:
            yield " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24))).capitalize() + "."
        elif kind == 1:
            yield f"{rng.choice(WORDS)}_{rng.choice(WORDS)} = {rng.randint(0, 99999)}  # {rng.choice(WORDS)}"
        elif kind == 2:
            yield "".join(rng.choice("bcdfghjklmnprstvwz") + rng.choice("aeiou") for _ in range(rng.randint(2, 6)))
        else:
            yield json.dumps({rng.choice(WORDS): rng.random(), "id": rng.randint(0, 10**6)})


def train() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def check(model_dir: Path) -> None:
    """Fail the build, not the first request, if transformers cannot load what we wrote."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert len(tokenizer) == config.vocab_size, (len(tokenizer), config.vocab_size)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
    assert tokenizer.eos_token_id == config.eos_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", text
    sample = "The cache serves the prefix."
    assert tokenizer.decode(tokenizer.encode(sample)) == sample


def main(model_dir: Path) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train()
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"tokenizer vocab {tokenizer.get_vocab_size()} != {VOCAB_SIZE}: enlarge the corpus")
    tokenizer.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    check(model_dir)
    print(f"tokenizer: {tokenizer.get_vocab_size()} tokens written to {model_dir}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
