"""The hopper family's backward on the GPU: dispatch runs it on compute capability 9.0 wherever its
head dim has a backward table (variable-length batches too, each sequence's gradients its own),
key blocks that no query sees write zero gradients and so do query blocks that no key block
reaches (dQ's workspace is stored first, not zeroed), long causal and GQA walks accumulate dQ
right, the split of
head dims 192 and 256 and head dim 96's uneven dQ column shares meet every score modifier,
the window and dropout at the right positions, the pieces of split key blocks sum their dK and dV,
and deterministic runs (dQ added in a fixed order, by semaphores) are bit-identical, including grids
of more key blocks than SMs, which wait on blocks launched before them. The rest of the backward
suite (test_backward, test_training, test_compile) runs on it too (it is the default there);
scripts/gpu_check.sh runs those files again with FLASHGEN_FAMILY=mma."""

from __future__ import annotations

import os

import pytest
import torch

from flashgen import (backward, flash_attn_func, flash_attn_varlen_func,
                      scaled_dot_product_attention)
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_allocations")]

hopper_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="the hopper family runs on compute capability 9.0")


def grads_and_reference(q, k, v, causal, deterministic=False):
    """flashgen's dq, dk, dv; the fp32 reference's; PyTorch's in the inputs' dtype."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, causal=causal, deterministic=deterministic)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    expected = []
    for upcast in (True, False):
        ref_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        ref, _ = attention_ref(*ref_leaves, causal=causal, upcast=upcast)
        expected.append(torch.autograd.grad(ref, ref_leaves, dout))
    return grads, expected[0], expected[1], dout


def assert_grads_close(grads, reference, same_dtype):
    for name, grad, ref, pt in zip(("dq", "dk", "dv"), grads, reference, same_dtype):
        assert_close_fa2(grad, ref, pt, name, eps=GRADIENT_EPS)


@hopper_gpu
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_dispatch_runs_the_hopper_backward_on_compute_capability_9_0(head_dim, mask):
    spec = backward.kernel_for(torch.device("cuda", 0), "bf16", head_dim, mask)
    assert spec.family == (os.environ.get("FLASHGEN_FAMILY") or "hopper")
    varlen = backward.kernel_for(torch.device("cuda", 0), "bf16", head_dim, mask, varlen=True)
    assert varlen == spec


@hopper_gpu
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_key_blocks_no_query_sees_get_zero_gradients(head_dim):
    """Top-left causal (SDPA's) with more keys than queries: the key blocks past the last query
    have no step to walk and must still write dK = dV = 0 over the poisoned allocations."""
    q = torch.randn(2, 100, 8, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 700, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out = scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True,
                                       enable_gqa=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert torch.isfinite(dq).all()
    assert torch.equal(dk[:, 100:], torch.zeros_like(dk[:, 100:]))
    assert torch.equal(dv[:, 100:], torch.zeros_like(dv[:, 100:]))
    assert dk[:, :100].abs().sum() > 0 and dv[:, :100].abs().sum() > 0


@hopper_gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["any-order", "deterministic"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256], ids=lambda d: f"hd{d}")
def test_query_blocks_no_key_block_reaches_get_zero_dq(head_dim, deterministic):
    """Bottom-right causal with more queries than keys: rows 0..599 see no key, so no key block
    reaches the first query blocks. dQ's workspace is not zeroed (the first key block to reach a
    query block, or a deterministic run's first turn, stores its share there; at head dim 256 a
    run that need not be deterministic adds from registers into a zeroed one): those rows must
    still come out 0 over the poisoned scratch, and the rest match the reference."""
    q = torch.randn(2, 700, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 100, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    grads, reference, same_dtype, _ = grads_and_reference(q, k, v, True, deterministic)
    assert torch.equal(grads[0][:, :600], torch.zeros_like(grads[0][:, :600]))
    assert_grads_close(grads, reference, same_dtype)


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256], ids=lambda d: f"hd{d}")
def test_long_gqa_walks(head_dim, dtype, causal):
    """Each thread block walks every query block of its KV head's 4 query heads (GQA's sums in
    registers), 3000 odd rows long, its dQ shares added by many key blocks."""
    q = torch.randn(1, 3000, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(1, 3000, 2, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    grads, reference, same_dtype, _ = grads_and_reference(q, k, v, causal)
    assert_grads_close(grads, reference, same_dtype)


@hopper_gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"hd{d}")
def test_split_key_blocks_sum_their_pieces(head_dim):
    """Without a mask the grid's last wave runs as pieces, each a share of its key blocks' steps,
    which sum dK and dV in an fp32 workspace; the last piece to finish writes them. 36 or 72 key
    blocks (all in the last wave) of a GQA walk over 777 odd rows, a partial last key block."""
    from flashgen.families import hopper

    q = torch.randn(2, 777, 6, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1100, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    spec = backward.kernel_for(q.device, "bf16", head_dim, "none")
    assert hopper.backward_grid(spec, q.shape, k.shape[1:3], 0, False).splits > 1
    grads, reference, same_dtype, _ = grads_and_reference(q, k, v, False)
    assert_grads_close(grads, reference, same_dtype)


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256], ids=lambda d: f"hd{d}")
def test_deterministic_gqa_is_bit_identical(head_dim, causal):
    """GQA and head dim 256 explicitly (FlashAttention-3's deterministic mode has had wrong
    results there); head dims 192 and 256's consumers split the head dim, each adding its own
    columns in turn."""
    q = torch.randn(2, 1500, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1500, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    torch.manual_seed(1)
    first, reference, same_dtype, dout = grads_and_reference(q, k, v, causal, deterministic=True)
    assert_grads_close(first, reference, same_dtype)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    for run in range(3):
        out = flash_attn_func(*leaves, causal=causal, deterministic=True)
        again = torch.autograd.grad(out, leaves, dout)
        for name, grad, was in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(grad, was), f"{name} differs in run {run}"


@hopper_gpu
def test_deterministic_rotated_walks_across_waves_are_bit_identical():
    """Without a mask, 33 key blocks per head (a quarter of an H100's SMs, the most that walk
    rotated) over 16 (batch, KV head)s, more blocks than SMs: heads start in one wave and end in
    the next, their blocks taking dQ turns in the order they reach each query block; the result
    matches the reference and repeats bit for bit."""
    q, k, v = (torch.randn(2, 33 * 128, 8, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    torch.manual_seed(2)
    first, reference, same_dtype, dout = grads_and_reference(q, k, v, False, deterministic=True)
    assert_grads_close(first, reference, same_dtype)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    for run in range(2):
        out = flash_attn_func(*leaves, deterministic=True)
        again = torch.autograd.grad(out, leaves, dout)
        for name, grad, was in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(grad, was), f"{name} differs in run {run}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, seqlen", [(128, 17000), (256, 8500)], ids=["hd128", "hd256"])
def test_deterministic_grid_of_more_key_blocks_than_sms(head_dim, seqlen, causal):
    """4 heads x 133 key blocks, more per head than an H100 has SMs, so a head's blocks cannot
    all run at once: they walk in order and wait only on the key blocks after theirs, which
    launch first (without a mask too, where fewer blocks would walk rotated and take turns as
    they arrive), so the run ends (a wrong order would hang) and matches the reference. At head
    dim 128 the dQ warp waits for the turns, at 256 the consumers (they add from registers)."""
    q, k, v = (torch.randn(1, seqlen, 4, head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    grads, reference, same_dtype, _ = grads_and_reference(q, k, v, causal, deterministic=True)
    assert_grads_close(grads, reference, same_dtype)


def varlen_grads(lengths_q, lengths_k, heads, head_dim, causal, deterministic=False):
    """A packed batch's (q, k, v), cu_seqlens, dout and flashgen's gradients."""
    def packed(lengths, h):
        return torch.randn(sum(lengths), h, head_dim, device="cuda", dtype=torch.bfloat16)

    def cu(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda",
                            dtype=torch.int32)

    q, k, v = (packed(lengths_q, heads[0]), packed(lengths_k, heads[1]),
               packed(lengths_k, heads[1]))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    # max_seqlen_q above the longest: allowed, the layout's query blocks go unused
    out = flash_attn_varlen_func(*leaves, cu(lengths_q), cu(lengths_k), max(lengths_q) + 70,
                                 max(lengths_k), causal=causal, deterministic=deterministic)
    dout = torch.randn_like(out)
    return (q, k, v), (cu(lengths_q), cu(lengths_k)), dout, torch.autograd.grad(out, leaves, dout)


# Sequence lengths (queries, keys): every sequence's keys end inside a key block, whose dK and dV
# must not run into the next sequence's rows; one sequence has keys and no queries (zero dK and
# dV), one queries and no keys (zero dQ); one walks more query blocks than the others' lengths.
VARLEN_LENGTHS = ([300, 0, 1000, 77, 5], [300, 45, 1000, 130, 0])


def assert_varlen_grads_match_each_sequence(lengths_q, lengths_k, heads, head_dim, causal):
    """flashgen's gradients of a packed batch against the fp32 reference run per sequence."""
    (q, k, v), (cu_q, cu_k), dout, grads = varlen_grads(lengths_q, lengths_k, heads, head_dim,
                                                        causal)
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for i in range(len(lengths_q)):
        rows_q = slice(bounds_q[i], bounds_q[i + 1])
        rows_k = slice(bounds_k[i], bounds_k[i + 1])
        dq, dk, dv = (grad[rows] for grad, rows in zip(grads, (rows_q, rows_k, rows_k)))
        if lengths_q[i] == 0 or lengths_k[i] == 0:  # nothing flows back
            for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
                assert torch.equal(grad, torch.zeros_like(grad)), f"{name} of sequence {i}"
            continue
        expected = []
        for upcast in (True, False):
            leaves = [t.detach()[None].clone().requires_grad_()
                      for t in (q[rows_q], k[rows_k], v[rows_k])]
            ref, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
            expected.append(torch.autograd.grad(ref, leaves, dout[rows_q][None]))
        for name, grad, ref, pt in zip(("dq", "dk", "dv"), (dq, dk, dv), *expected):
            assert_close_fa2(grad[None], ref, pt, f"{name} of sequence {i}", eps=GRADIENT_EPS)


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_varlen_gradients_match_each_sequence_alone(head_dim, causal):
    """The hopper backward on a packed batch (GQA), against the fp32 reference per sequence."""
    assert backward.kernel_for(torch.device("cuda", 0), "bf16", head_dim,
                               "causal" if causal else "none", varlen=True).family == (
        os.environ.get("FLASHGEN_FAMILY") or "hopper")
    assert_varlen_grads_match_each_sequence(*VARLEN_LENGTHS, (8, 2), head_dim, causal)


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen_many_short_sequences_beside_a_long_one(head_dim, causal):
    """Packed training batches: 40 short sequences of odd lengths and one long. The workspaces
    hold each sequence's own query blocks (not 41 of the longest's each), packed one after
    another: every boundary between neighbours is exercised."""
    lengths = torch.randint(1, 200, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    lengths.insert(17, 1500)
    assert_varlen_grads_match_each_sequence(lengths, lengths, (4, 2), head_dim, causal)


@hopper_gpu
def test_varlen_split_key_blocks_sum_their_pieces():
    """A packed batch's grid is split as a dense batch of its longest lengths: 3 x 4 x 16 key
    blocks, the last wave's in pieces (on an H100 the last 60, most of them the short last
    sequence's, whose pieces, shares of its walk of one step, mostly have no step, and blocks
    past its keys)."""
    from flashgen.families import hopper

    lengths = [2048, 1000, 37]
    spec = backward.kernel_for(torch.device("cuda", 0), "bf16", 128, "none", varlen=True)
    # (varlen_grads passes max_seqlen_q = 2048 + 70)
    grid = hopper.backward_grid(spec, (3, 2048 + 70, 4, 128), (2048, 4), 0, False)
    assert grid.split_blocks > 0 and grid.splits > 1
    assert_varlen_grads_match_each_sequence(lengths, lengths, (4, 4), 128, False)


@hopper_gpu
@pytest.mark.parametrize("head_dim", [128, 256])
def test_varlen_deterministic_gqa_is_bit_identical(head_dim):
    """A packed batch's deterministic turns count its own sequence's key blocks."""
    lengths = ([4000, 129, 2500], [4000, 700, 2600])
    torch.manual_seed(0)
    _, _, _, first = varlen_grads(*lengths, (8, 2), head_dim, True, deterministic=True)
    for _ in range(2):
        torch.manual_seed(0)
        _, _, _, again = varlen_grads(*lengths, (8, 2), head_dim, True, deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@hopper_gpu
@pytest.mark.parametrize("call", [
    dict(causal=True, softcap=20.0),
    dict(causal=False, alibi_slopes="slopes"),
    dict(causal=False, window_size=(100, 50)),
    dict(causal=True, dropout_p=0.17),
    dict(causal=False, softcap=20.0, dropout_p=0.3),
], ids=["causal_softcap", "alibi", "window", "causal_dropout", "softcap_dropout"])
@pytest.mark.parametrize("head_dim", [96, 192, 256])
def test_gradients_under_modifiers_masks_and_dropout_at_other_splits(head_dim, call):
    """Above head dim 128 the two consumers share 64 keys, each with half of a step's query rows;
    at head dim 96 the consumers' dQ shares are 64 and 32 columns: the score modifiers, the
    window and dropout's mask must see each row's own position (odd lengths, GQA, bf16)."""
    from tests.gpu.test_backward import assert_attention_matches_reference, make_qkv
    from tests.gpu.test_dropout import mask_of_next_call

    batch, seqlen_q, seqlen_k, heads, heads_kv = 2, 333, 271, 4, 2
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, torch.bfloat16,
                       False)
    assert backward.kernel_for(q.device, "bf16", head_dim, "none").family == "hopper"
    if "alibi_slopes" in call:
        call = dict(call, alibi_slopes=torch.rand(heads, device="cuda"))
    reference = dict(call)
    if "dropout_p" in call:
        reference["dropout_keep"] = mask_of_next_call(7, call["dropout_p"], batch, heads,
                                                      seqlen_q, seqlen_k)
    assert_attention_matches_reference(q, k, v, reference, **call)
