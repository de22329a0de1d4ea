"""Names that become a Redis hash tag (``herd:…:{name}:…``): queues, exact-cache
namespaces, semantic caches.

A brace would end the tag early: the keys of a cache named ``acme}:8:e:x`` began with
those of cache ``acme``, which then read and cleared them. Such names are refused on
every backend (``check_name``), so that a name means the same on each; the Redis key
builders refuse them again (``hash_tag``), whatever path a name came by.
"""

from __future__ import annotations

from collections.abc import Iterable

from herd.errors import InvalidInput
from herd.jsonvalue import check_text
from herd.queue.base import MAX_NAME_LENGTH  # a queue's bound, for every name of this kind

__all__ = ["MAX_NAME_LENGTH", "check_name", "hash_tag", "tagged"]


def hash_tag(name: str, what: str, field: str) -> str:
    """``{name}``, refusing a name with a brace (InvalidInput naming ``what``)."""
    if "{" in name or "}" in name:
        raise InvalidInput(
            f"{what} {name!r:.80} may not contain braces (they form Redis hash tags):"
            " choose one without { or }",
            field=field,
        )
    return f"{{{name}}}"


def tagged(names: Iterable[str]) -> list[str]:
    """The names of a stored set that can be a hash tag; one with a brace was stored
    before names were checked, and its keys expire by themselves."""
    return [n for n in names if "{" not in n and "}" not in n]


def check_name(name: str, what: str, field: str, *, max_length: int = MAX_NAME_LENGTH) -> str:
    """A name a store keeps intact, 1 to ``max_length`` characters, without braces."""
    check_text(name, field, max_length=max_length)
    if not name:
        raise InvalidInput(f"{what} must not be empty", field=field)
    hash_tag(name, what, field)
    return name
