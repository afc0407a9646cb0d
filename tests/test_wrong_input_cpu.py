"""The argument checks that need no GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flashgen import flash_attn_func, scaled_dot_product_attention  # noqa: E402


def cpu_qkv():
    return [torch.randn(1, 16, 2, 64, dtype=torch.bfloat16) for _ in range(3)]


def test_cpu_tensors_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match=r"q is on cpu.*\.cuda\(\)"):
        flash_attn_func(*cpu_qkv())


def test_sdpa_cpu_tensors():
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="query is on cpu"):
        scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize("kwargs, name", [({"dropout_p": 0.1}, "dropout_p"),
                                          ({"window_size": (4, 4)}, "window_size"),
                                          ({"softcap": 1.0}, "softcap"),
                                          ({"alibi_slopes": [1.0]}, "alibi_slopes")])
def test_unsupported_arguments_name_themselves(kwargs, name):
    with pytest.raises(NotImplementedError, match=name):
        flash_attn_func(*cpu_qkv(), **kwargs)


def test_non_tensor():
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        flash_attn_func([1.0], *cpu_qkv()[1:])
