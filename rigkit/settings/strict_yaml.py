"""YAML as rigkit reads the files users edit (profiles.yaml): PyYAML's safe loader, except that a key given twice
in one mapping is refused with both lines (PyYAML keeps the last silently, so a second profile of the same name
would replace the first unseen)."""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKey(yaml.MarkedYAMLError):
    """A mapping names one key twice."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader refusing duplicate keys."""


# libyaml's parser with PyYAML's own safe constructor and resolver: the same documents, parsed ~5x faster (a
# deploy reads profiles.yaml and each rendering's compose.yml once per rig); its errors carry no excerpt of the
# text, so a document it refuses is read again by StrictLoader for the message.
FastStrictLoader = type("FastStrictLoader", (yaml.CSafeLoader,), {}) if yaml.__with_libyaml__ else None


def _mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise DuplicateKey(
                f"{key!r} is given twice in one mapping (first at line {seen[key].start_mark.line + 1})",
                seen[key].start_mark,
                "given again here",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


for _loader in (StrictLoader, FastStrictLoader):
    if _loader is not None:
        _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load(text: str) -> Any:
    """The document in ``text``; yaml.YAMLError (DuplicateKey for a key given twice) on a problem."""
    if FastStrictLoader is not None:
        try:
            return yaml.load(text, Loader=FastStrictLoader)
        except yaml.YAMLError:
            pass  # the same refusal again, with the excerpt PyYAML's own parser shows
    return yaml.load(text, Loader=StrictLoader)
