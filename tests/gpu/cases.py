"""The dtypes, head dims and shapes the forward and backward suites both sweep."""

import pytest
import torch

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 64, 96, 128, 192, 256]
# (batch, seqlen_q, seqlen_k, heads, heads_kv, packed): packed slices q, k, v out of one qkv
# tensor (and the backward's dout out of a wider one), so they are non-contiguous.
SHAPES = [
    (1, 1, 1, 8, 8, False),
    (2, 17, 17, 8, 2, True),
    (1, 113, 203, 8, 1, False),
    (3, 128, 128, 8, 8, True),
    (2, 239, 113, 8, 2, False),
    (1, 512, 1023, 8, 1, False),
    (2, 1023, 512, 8, 8, False),
    (1, 2048, 2048, 8, 2, True),
    (2, 1, 239, 8, 8, False),
    (1, 239, 1, 8, 2, False),
]

def shape_id(shape) -> str:
    return "b{}_q{}_k{}_h{}_hk{}{}".format(*shape[:5], "_packed" if shape[5] else "")


def matrix_cases(test):
    """Parametrizes test(dtype, head_dim, causal, shape) over the default config's
    specialisation matrix and SHAPES."""
    return _parametrize(test, [
        pytest.mark.parametrize("shape", SHAPES, ids=shape_id),
        pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"]),
        pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}"),
        pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])])


# The SDPA drop-in's own grid: (batch, seqlen_q, seqlen_k, heads, heads_kv).
SDPA_SHAPES = [(2, 17, 17, 8, 8), (1, 239, 113, 8, 2), (2, 113, 239, 8, 1), (1, 1024, 1024, 8, 8)]


def sdpa_cases(test):
    """Parametrizes test(dtype, head_dim, is_causal, shape) over the SDPA drop-in's grid."""
    return _parametrize(test, [
        pytest.mark.parametrize("shape", SDPA_SHAPES,
                                ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s)),
        pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"]),
        pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"hd{d}"),
        pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])])


def _parametrize(test, marks):
    for mark in marks:
        test = mark(test)
    return test
