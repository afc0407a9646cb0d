"""A call's run-time mask arguments: the band a mask kind (codegen/masks.py) reads per call."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.params import WINDOW_UNBOUNDED


@dataclass(frozen=True)
class Band:
    """A call's run-time mask arguments (params.h): query row i sees key j iff
    i + offset - left <= j <= i + offset + right (the window kind; the causal kind reads the
    offset alone, its band is right = 0 with left unbounded, the none kind reads nothing). The
    default is causal attention aligned top-left; offset seqlen_k - seqlen_q aligns it
    bottom-right."""
    offset: int = 0
    left: int = WINDOW_UNBOUNDED
    right: int = 0

    def fields(self) -> dict:
        """The params fields, by name."""
        return {"mask_offset": self.offset, "window_left": self.left,
                "window_right": self.right}
