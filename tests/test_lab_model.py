"""rigkit.lab.lab_model without training: the model's cache key follows its inputs, its corpus is rigkit.prompts'
own text from fixed seeds, and only a complete directory counts as a model."""

from __future__ import annotations

import json

from rigkit.lab import lab_model
from rigkit.prompts import PromptSpec, draft_text


def test_the_corpus_is_the_validation_prompts_text_from_fixed_seeds():
    corpus = lab_model.training_corpus()
    assert corpus == lab_model.training_corpus()
    assert len(corpus) == lab_model.CORPUS_DOCUMENTS
    assert {d["kind"] for d in corpus} == {"narrative", "code"}
    assert corpus[0]["text"].startswith("Session ") and "Continue this story." in corpus[0]["text"]
    assert "def update_" in corpus[1]["text"]
    held_out = lab_model.eval_prompts()
    assert not {d["text"] for d in held_out} & {d["text"] for d in corpus}
    assert all(len(d["text"]) >= lab_model.EVAL_PROMPT_CHARS for d in held_out)
    # the same generator validation uses: a body from a seed is what draft_text writes
    assert draft_text(PromptSpec("narrative", 0, 5), "s" * 32, 200).startswith("Session " + "s" * 32)


def test_the_model_key_follows_sources_pins_and_corpus(monkeypatch, tmp_path):
    key = lab_model.model_key()
    assert key == lab_model.model_key() and lab_model.model_dir().name == key
    monkeypatch.setattr(lab_model, "TRAIN_REQUIREMENTS", ("torch==2.13.1",))
    assert lab_model.model_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(lab_model, "CORPUS_DOCUMENTS", lab_model.CORPUS_DOCUMENTS + 1)
    assert lab_model.model_key() != key
    monkeypatch.undo()
    sources = tmp_path / "sources"
    sources.mkdir()
    for path in lab_model.SOURCES.iterdir():
        if path.is_file():
            (sources / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(lab_model, "SOURCES", sources)
    assert lab_model.model_key() == key
    (sources / "train_model.py").write_text((sources / "train_model.py").read_text() + "\n# edited\n")
    assert lab_model.model_key() != key


def test_only_a_complete_directory_is_a_model(tmp_path):
    for name in lab_model.MODEL_FILES[:-1]:
        (tmp_path / name).write_text("{}")
    assert not lab_model.is_complete(tmp_path)
    (tmp_path / "training.json").write_text(json.dumps({"margins": {"median": 5.0}}))
    assert lab_model.is_complete(tmp_path) and lab_model.training_record(tmp_path)["margins"]["median"] == 5.0


def test_the_served_config_is_a_qwen3_the_tokenizer_fits():
    config = json.loads((lab_model.SOURCES / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["vocab_size"] == 2048
