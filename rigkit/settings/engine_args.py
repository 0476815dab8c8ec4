"""How vLLM's command line reads an engine argument: which flag an `extra_engine_args` item sets.

vLLM 0.26 and 0.32 parse with FlexibleArgumentParser (vllm/utils/argparse_utils.py), an argparse.ArgumentParser
that leaves allow_abbrev at its default (on): before argparse it turns `_` into `-` in a long option's name (up to
its first `.`), reads `--flag.key value` as a key of the JSON flag `--flag`, and `-O3` as --optimization-level;
argparse then takes `--flag=value`, a short flag's attached value (`-qfp8`), and a prefix of an option as the
option when it fits only that one (`--max-model` is --max-model-len, `-t` is -tp) and refuses to start when it
fits several (`--quantiz`: --quantization or --quantization-config). A repeated flag keeps its last value
(0.26 and 0.32 log "Found duplicate keys" only for the same spelling). Both parsers are captured, with how
they read every prefix of every flag rigkit guards, in tests/fixtures/vllm-cli/.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

# vLLM's other spellings of flags rigkit renders (vllm/engine/arg_utils.py; both releases' parsers are in
# tests/fixtures/vllm-cli): the short forms (0.26 and 0.32) and 0.32's second name for the GPU memory share.
ENGINE_FLAG_ALIASES = {
    "-q": "--quantization",
    "-sc": "--speculative-config",
    "-tp": "--tensor-parallel-size",
    "--device-memory-utilization": "--gpu-memory-utilization",
}


def engine_option(arg: str) -> str:
    """The option an engine argument names, as vLLM spells it before argparse matches it: ``--max_model_len=8192``
    -> ``--max-model-len``, ``--kv-transfer.kv_role`` -> ``--kv-transfer``, ``-tp=2`` -> ``-tp``; '' for a value."""
    if arg.startswith("--"):
        option = "--" + arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
        return "" if option == "--" else option  # a bare "--" ends the options
    return arg.split("=", 1)[0] if arg.startswith("-") and len(arg) > 1 else ""


def engine_spellings(flags: Iterable[str], yes_no: Iterable[str] = ()) -> dict[str, str]:
    """Every spelling vLLM takes for one of `flags` -> that flag: the flag, its aliases, and `--no-FLAG` for a
    yes/no flag (argparse.BooleanOptionalAction)."""
    flags = set(flags)
    spellings = {flag: flag for flag in flags}
    spellings |= {alias: flag for alias, flag in ENGINE_FLAG_ALIASES.items() if flag in flags}
    return spellings | {"--no-" + flag[2:]: flag for flag in yes_no if flag in flags}


class FlagReading(NamedTuple):
    """How vLLM may read an argument as flags of a set: `spelled` is the spelling it matched (or abbreviates)."""

    flags: tuple[str, ...] = ()
    spelled: tuple[str, ...] = ()
    abbreviated: bool = False

    def __str__(self) -> str:
        """What the argument does, for a refusal: 'sets --x', 'abbreviates --x (as -tp)', ..."""
        named, spelled = " or ".join(self.flags), " or ".join(self.spelled)
        return (
            ("abbreviates " if self.abbreviated else "sets ") + named + ("" if spelled == named else f" (as {spelled})")
        )

    @property
    def outcome(self) -> str:
        """What vLLM would do with it beside rigkit's own flag."""
        if not self.abbreviated:
            return "vLLM would silently take one of the two values"
        return "vLLM takes a prefix that fits one flag as that flag, and stops on one that fits several"


def read_as(arg: str, spellings: dict[str, str]) -> FlagReading:
    """Which of the flags in `spellings` (engine_spellings) vLLM may read `arg` as; empty when none."""
    option = engine_option(arg)
    if not option:
        return FlagReading()
    if option in spellings:
        return FlagReading((spellings[option],), (option,))
    # argparse reads a one-letter short flag's value attached to it (-qfp8 is -q fp8; no spelling is "--")
    if option[:2] in spellings:
        return FlagReading((spellings[option[:2]],), (option[:2],))
    prefixed = sorted(spelling for spelling in spellings if spelling.startswith(option))
    return FlagReading(tuple(sorted({spellings[spelling] for spelling in prefixed})), tuple(prefixed), bool(prefixed))
