"""Each kernel family's run-time decisions, by family name: which of a head dim's tiles runs a
call, and the family's own params fields (grid order, workspaces). A family that needs none uses
the defaults below."""

from __future__ import annotations

import functools
import importlib

from flashgen.band import Band


class DefaultRuntime:
    """The main tile for every call; no fields beyond the shared ones."""

    @staticmethod
    def forward_plan(candidates, batch_heads: int, seqlen_q: int, device_index: int):
        return candidates[0], {}

    @staticmethod
    def backward_args(spec, q, k, v, out, dout, lse, dq, dk, dv, scale: float, band: Band,
                      deterministic: bool, varlen: tuple = (), mods=None):
        """(BwdArgs, the scratch tensor they point into, to keep alive through the launch)."""
        raise NotImplementedError(f"flashgen: family {spec.family} has no backward runtime")


@functools.cache
def runtime(family: str):
    """flashgen.families.<family> if it exists, else DefaultRuntime."""
    try:
        return importlib.import_module(f"flashgen.families.{family}")
    except ModuleNotFoundError as e:
        if e.name != f"flashgen.families.{family}":
            raise
        return DefaultRuntime

