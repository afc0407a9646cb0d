"""FlashAttention-2's `flash_attn` package, served by flashgen.

    import flashgen.compat
    flashgen.compat.install()      # before anything imports flash_attn
    from flash_attn import flash_attn_func

install() makes `import flash_attn` and its submodules (flash_attn_interface, bert_padding,
layers.rotary) resolve to this package, for code that imports FlashAttention-2 by name. Where
flashgen's own semantics differ on purpose, these functions give FA2's (flash_attn_interface's
docstring lists them); install() also keeps every backward's dK and dV in the process the same
bits from run to run without deterministic=True, as FA2's are (schedule.keep_dkdv_reproducible).
"""

from __future__ import annotations

import sys

from flashgen import schedule
from flashgen.compat import bert_padding, flash_attn_interface, layers
from flashgen.compat.flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from flashgen.compat.layers import rotary

# The FlashAttention-2 release whose API this package serves (code that picks features by
# flash_attn.__version__ reads it).
__version__ = "2.8.4"
__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache", "install"]

_MODULES = {"flash_attn": sys.modules[__name__],
            "flash_attn.flash_attn_interface": flash_attn_interface,
            "flash_attn.bert_padding": bert_padding,
            "flash_attn.layers": layers,
            "flash_attn.layers.rotary": rotary}


def install() -> None:
    """Makes `import flash_attn` (and its submodules) import this package. Raises if another
    flash_attn is already imported: code holding its functions would not see flashgen."""
    current = sys.modules.get("flash_attn")
    if current is not None and current is not _MODULES["flash_attn"]:
        raise RuntimeError(f"flashgen.compat.install(): flash_attn is already imported from "
                           f"{getattr(current, '__file__', current)!r}; call install() before "
                           f"anything imports it")
    sys.modules.update(_MODULES)
    schedule.keep_dkdv_reproducible()  # FA2's contract, for the code that imports it by name
