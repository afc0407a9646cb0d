"""The kernel families codegen knows, by name. A new family is a module beside mma/ and one line
here (or a register() call, as the tests' toy family does)."""

from __future__ import annotations

from codegen.family import Family
from codegen.families import hopper, mma

FAMILIES: dict[str, Family] = {f.name: f for f in (hopper.FAMILY, mma.FAMILY)}


def register(family: Family) -> None:
    """Adds a family (e.g. from a plugin or a test); its name becomes a config table."""
    FAMILIES[family.name] = family


def unregister(name: str) -> None:
    FAMILIES.pop(name, None)
