"""Block-sparse attention: the default config's `block_sparse` variant, whose layout lists the
128 x 128 blocks each query block sees. Forward and gradients against the dense masked
reference on every family, and the blocks it leaves out never read: their keys and values (and
the queries and output gradients of a query block that lists nothing) are NaN, which any read
would spread into the results."""

from __future__ import annotations

import pytest
import torch

import flashgen
from flashgen import flash_attn_func
from flashgen.reference import assert_close_fa2, attention_ref
from tests.gpu.test_backward import (assert_attention_matches_reference, assert_grads_close,
                                     make_qkv)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

BLOCK = 128  # the variant's block size
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def random_layout(batch: int, seqlen_q: int, seqlen_k: int, density: float) -> torch.Tensor:
    """(batch, q blocks, k blocks) int32, each entry listed with probability `density` and every
    query block listing at least one key block."""
    q_blocks, k_blocks = -(-seqlen_q // BLOCK), -(-seqlen_k // BLOCK)
    layout = (torch.rand(batch, q_blocks, k_blocks) < density).int()
    layout[:, torch.arange(q_blocks), torch.randint(k_blocks, (q_blocks,))] = 1
    return layout.cuda()


def visible(layout: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """The layout at element granularity, (batch, 1, seqlen_q, seqlen_k) bool."""
    rows = torch.arange(seqlen_q, device="cuda") // BLOCK
    cols = torch.arange(seqlen_k, device="cuda") // BLOCK
    return (layout[:, rows][:, :, cols] != 0)[:, None]


# (batch, seqlen_q, seqlen_k, heads, heads_kv): odd lengths (a partial last block), unequal
# lengths, GQA.
SHAPES = [(2, 1000, 1000, 8, 2), (1, 700, 1300, 4, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}_hk{}".format(*s))
@pytest.mark.parametrize("prebuilt", [False, True], ids=["per_call", "block_mask"])
@pytest.mark.parametrize("density", [0.3, 0.7])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_matches_the_dense_masked_reference(dtype, head_dim, density, prebuilt, shape,
                                            each_family):
    batch, seqlen_q, seqlen_k, heads, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, DTYPES[dtype],
                       False)
    layout = random_layout(batch, seqlen_q, seqlen_k, density)
    tensors = {"layout": layout}
    block_mask = flashgen.block_mask("block_sparse", q, k, tensors) if prebuilt else None
    reference = dict(causal=False, visible=visible(layout, seqlen_q, seqlen_k))
    assert_attention_matches_reference(q, k, v, reference, variant="block_sparse",
                                       variant_tensors=tensors, block_mask=block_mask)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_unlisted_blocks_are_never_read(head_dim, deterministic, each_family):
    batch, seqlen, heads, heads_kv = 2, 1000, 4, 2
    layout = random_layout(batch, seqlen, seqlen, 0.5)
    unlisted_keys, unlisted_queries = (2, 5), 3
    layout[:, :, list(unlisted_keys)] = 0
    layout[:, unlisted_queries] = 0
    clean = make_qkv(batch, seqlen, seqlen, heads, heads_kv, head_dim, torch.bfloat16, False)
    dout_clean = torch.randn_like(clean[0])
    # The same values with NaN where nothing may be read.
    q, k, v = (t.detach().clone() for t in clean)
    dout = dout_clean.clone()
    rows = slice(unlisted_queries * BLOCK, (unlisted_queries + 1) * BLOCK)
    q[:, rows] = float("nan")
    dout[:, rows] = float("nan")
    for block in unlisted_keys:
        k[:, block * BLOCK:(block + 1) * BLOCK] = float("nan")
        v[:, block * BLOCK:(block + 1) * BLOCK] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    out, lse, _ = flash_attn_func(q, k, v, variant="block_sparse",
                                  variant_tensors={"layout": layout}, deterministic=deterministic,
                                  return_attn_probs=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, t in zip(("out", "dq", "dk", "dv"), (out, *grads)):
        assert not t.isnan().any(), f"{name} read a block the layout leaves out"
    assert (out[:, rows] == 0).all() and lse[:, :, rows].isneginf().all()
    assert (grads[0][:, rows] == 0).all()
    for block in unlisted_keys:
        assert (grads[1][:, block * BLOCK:(block + 1) * BLOCK] == 0).all()
        assert (grads[2][:, block * BLOCK:(block + 1) * BLOCK] == 0).all()

    reference = dict(causal=False, visible=visible(layout, seqlen, seqlen))
    out_ref, _ = attention_ref(*clean, **reference)
    out_pt, _ = attention_ref(*clean, upcast=False, **reference)
    assert_close_fa2(out, out_ref, out_pt, "out")
    # dO's rows that see nothing contribute nothing: the reference may use the clean ones.
    assert_grads_close(grads, *clean, dout_clean, **reference)


def test_a_layout_of_the_wrong_shape_names_the_blocks():
    q, k, v = make_qkv(2, 1000, 1000, 4, 4, 64, torch.bfloat16, False)
    layout = torch.ones(2, 7, 8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"must have shape \[batch, seqlen_q/128, seqlen_k/128\] "
                                         r"= \(2, 8, 8\), got \(2, 7, 8\)"):
        flash_attn_func(q, k, v, variant="block_sparse", variant_tensors={"layout": layout})
