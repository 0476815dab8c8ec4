"""pyinfra's global arguments read once per process (rigkit.fleet.global_arguments) equal pyinfra's own."""

import importlib
import typing

from pyinfra.api.arguments import AllArguments

from rigkit.fleet import global_arguments


def test_the_same_names_and_types_as_pyinfras_own_evaluated_once(monkeypatch):
    evaluated = []
    real = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda *a, **k: evaluated.append(a) or real(*a, **k))
    arguments = importlib.import_module("pyinfra.api.arguments")
    monkeypatch.setattr(arguments, "get_type_hints", typing.get_type_hints)
    global_arguments._global_arguments.cache_clear()

    ours = [global_arguments.all_global_arguments() for _ in range(3)]

    assert all(value == list(real(AllArguments).items()) for value in ours)
    assert len(evaluated) == 1
    ours[0].append(("mutated", str))  # a caller's list is its own, as pyinfra's
    assert global_arguments.all_global_arguments() == ours[1]


def test_install_puts_it_where_pyinfra_calls_it(monkeypatch):
    for module in ("pyinfra.api.arguments", "pyinfra.api.facts"):
        monkeypatch.setattr(importlib.import_module(module), "all_global_arguments", None)
    global_arguments.install()
    for module in ("pyinfra.api.arguments", "pyinfra.api.facts"):
        assert importlib.import_module(module).all_global_arguments is global_arguments.all_global_arguments
