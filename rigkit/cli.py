"""The `rigkit` command: the utilities that are not pyinfra deploys.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``; only the module
of the command run is imported, so one broken corner (a missing dependency, say) cannot break the others. A module may
declare ``OPTIONS_IN_PLACE``: (option, other option, whether it needs it) rules, checked here for every command, so an
option that means nothing where it stands is refused, never ignored.
"""

import argparse
import importlib
import sys
from typing import Iterable, Optional

from rigkit.errors import ConfigError

SUBCOMMANDS = {
    "lab": ("rigkit.lab.cli", "bring the local lab up, show it, tear it down"),
    "demo": ("rigkit.lab.demo", "lab up, deploy to every lab rig, run the checks, summarise"),
    "check-compose": ("rigkit.serving.compose_guard", "list variables a compose entrypoint reads but does not declare"),
    "resolve": ("rigkit.remote.registry", "resolve IMAGE:TAG to IMAGE@sha256:... via the registry API"),
    "resolve-model": (
        "rigkit.model.resolve",
        "pin a model: ORG/NAME[@BRANCH] to its commit, controller:/DIR to its manifest hash",
    ),
    "stage": (
        "rigkit.fleet.stage",
        "stage each rig's pinned model (model_source) into its store: once from the "
        "source, then rig to rig; --check reports damage",
    ),
    "card": ("rigkit.validation.card.cli", "re-render results cards from a run's JSON"),
    "deploy": (
        "rigkit.commands.deploy",
        "run a deploy over a fleet and summarise each rig (status, step, reason, release)",
    ),
    "status": (
        "rigkit.commands.status",
        "what each rig runs against today's data: drift, health, ledger, driver, L2, shm",
    ),
    "validate-shared": (
        "rigkit.commands.validate_shared",
        "the warm-shared tier: prefill on each sharing rig, ask every other, "
        "label by the asked rig's counters, into the cards",
    ),
    "validate": (
        "rigkit.commands.validate",
        "prove the cache tiers of any OpenAI-compatible vLLM endpoint by URL (one rigkit did not deploy): the card",
    ),
    "export": (
        "rigkit.commands.export",
        "one group's stack as Kubernetes objects or production-stack Helm values, refusing what they cannot say",
    ),
}


def build_parser(argv: Optional[list[str]] = None) -> argparse.ArgumentParser:
    """Every subcommand; with ``argv``, only the one it names imports its module (its options), so a command runs
    where another one's dependencies are missing or broken (``rigkit validate --url`` beside a cluster, no SSH)."""
    chosen = next((word for word in argv if not word.startswith("-")), None) if argv is not None else None
    parser = argparse.ArgumentParser(prog="rigkit", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text)
        sub.set_defaults(_module=module_name)
        if argv is not None and name != chosen:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            sub.set_defaults(_missing=True)
            continue
        module.add_arguments(sub)
    return parser


def _given(args: argparse.Namespace, option: str) -> bool:
    return bool(getattr(args, option.lstrip("-").replace("-", "_"), None))


def refuse_options_out_of_place(args: argparse.Namespace, rules: Iterable[tuple[str, str, bool]]) -> None:
    """ConfigError for an option given where it means nothing: each rule (option, other, needed) says ``option``
    works only with ``other`` (needed) or only without it."""
    for option, other, needed in rules:
        if _given(args, option) and _given(args, other) != needed:
            raise ConfigError(
                option,
                True,
                f"means nothing {'without' if needed else 'with'} {other}, so it would be silently ignored",
                f"add {other}" if needed else f"run it without {option}, or without {other}",
            )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    if getattr(args, "_missing", False):
        print(f"rigkit {args.command}: not built yet", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    try:
        refuse_options_out_of_place(args, getattr(module, "OPTIONS_IN_PLACE", ()))
    except ConfigError as exc:
        print(f"rigkit {args.command}: refused before any host was touched: {exc}", file=sys.stderr)
        return 2
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
