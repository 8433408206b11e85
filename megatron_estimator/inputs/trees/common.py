"""What the tree readers share: the optional ``frameworks`` extra (OmegaConf, Hydra) and the
located leaves of a YAML document.

The extra is optional: without it a tree reader returns one ``missing-extra`` problem naming
``megatron-estimator[frameworks]`` (``missing_extra``), never a traceback."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.yamlpos import YamlNode, key_location

EXTRA = "megatron-estimator[frameworks]"


def first_line(error: BaseException) -> str:
    """The first line of a library's error (OmegaConf's and Hydra's run on to several), or its
    class name when it says nothing (an empty ``IndexError`` from Hydra's override parser)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def omegaconf_or_none():
    """The ``omegaconf`` module, or None when the extra is not installed."""
    try:
        import omegaconf
    except ImportError:
        return None
    return omegaconf


def missing_extra(location: str, what: str) -> Problem:
    """The one problem for a tree config read without the extra."""
    return Problem("missing-extra", location,
                   f"reading {what} needs OmegaConf and Hydra, the optional extra: pip install '{EXTRA}'")


def extra_problem(location: str, what: str, *, hydra: bool = True) -> Problem | None:
    """``missing_extra``'s problem when OmegaConf (or, with ``hydra``, Hydra) is not installed;
    None when the extra is there."""
    if omegaconf_or_none() is None:
        return missing_extra(location, what)
    if hydra:
        try:
            import hydra  # noqa: F401
        except ImportError:
            return missing_extra(location, what)
    return None


def located_leaves(node: YamlNode, path: str, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """(key path, ``file:line key.path``) for every entry of a mapping tree, parents first."""
    for key, child in (node.entries or {}).items():
        here = prefix + (key,)
        yield here, key_location(path, child.line, ".".join(here))
        if child.is_mapping:
            yield from located_leaves(child, path, here)


def plain(value: Any) -> Any:
    """A resolved OmegaConf container as plain dicts and lists (interpolations resolved)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def override_locator(overrides: Sequence[str], overrides_at: str | Sequence[str]) -> Callable[[str], str | None]:
    """Where the last override of a key was given: ``overrides_at`` is one place for all (``command
    line``) or one per override (a launch script's ``file:line`` of each word); None when no
    override sets the key."""
    places = [overrides_at] * len(overrides) if isinstance(overrides_at, str) else list(overrides_at)

    def locate(key: str) -> str | None:
        for override, place in zip(reversed(overrides), reversed(places)):
            if override.lstrip("+~").split("=", 1)[0] == key:
                return f"{place} {override}"
        return None
    return locate
