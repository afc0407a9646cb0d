"""What flashgen knows about each GPU architecture it can target. Which kernels run there is the
families' business (codegen/families/)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str           # "sm_90"
    smem_limit: int     # bytes of shared memory one block may opt in to
    max_registers: int  # per thread
    bulk_reduce: bool = False  # cp.reduce.async.bulk: the copy engine adds shared to global

    @property
    def gencode(self) -> str:
        cc = self.name.removeprefix("sm_")
        return f"-gencode=arch=compute_{cc},code=sm_{cc}"

    @property
    def capability(self) -> tuple[int, int]:
        cc = self.name.removeprefix("sm_")
        return int(cc[:-1]), int(cc[-1])


ARCHS = {
    a.name: a
    for a in (
        Arch("sm_80", smem_limit=166912, max_registers=255),
        Arch("sm_86", smem_limit=101376, max_registers=255),
        Arch("sm_89", smem_limit=101376, max_registers=255),
        Arch("sm_90", smem_limit=232448, max_registers=255, bulk_reduce=True),
    )
}


def arch_for_capability(major: int, minor: int) -> str:
    return f"sm_{major}{minor}"
