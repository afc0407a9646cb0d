"""A user adds head dim 80 to a config, runs `flashgen generate`, and flash_attn_func works."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from codegen import paths

pytestmark = pytest.mark.gpu

HEAD_DIM_80 = """
[mma.{arch}.head_dim.80]
block_m = 128
block_n = 64
warps = 4
kv_stages = 2
"""

CHECK = textwrap.dedent("""
    import torch
    from flashgen import flash_attn_func
    from flashgen.reference import attention_ref, assert_close_fa2
    torch.manual_seed(0)
    for causal in (False, True):
        q = torch.randn(2, 239, 8, 80, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 300, 2, 80, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, 300, 2, 80, device="cuda", dtype=torch.bfloat16)
        out = flash_attn_func(q, k, v, causal=causal)
        assert_close_fa2(out, attention_ref(q, k, v, causal)[0],
                         attention_ref(q, k, v, causal, upcast=False)[0])
    print("head dim 80 ok")
""")


def test_add_head_dim_80_via_config(tmp_path):
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    config = tmp_path / "with_hd80.toml"
    config.write_text(paths.DEFAULT_CONFIG.read_text() + HEAD_DIM_80.format(arch=arch))
    env = dict(os.environ, FLASHGEN_CONFIG=str(config))
    subprocess.run([sys.executable, "-m", "flashgen", "generate", "--config", str(config),
                    "--arch", arch, "--head-dim", "80", "--dtype", "bf16",
                    "--out", str(tmp_path / "generated")], check=True, env=env)
    # JIT off: the kernel must come from what `generate` built, at its native head dim.
    result = subprocess.run([sys.executable, "-c", CHECK], env=dict(env, FLASHGEN_JIT="0"),
                            cwd=paths.REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "head dim 80 ok" in result.stdout
