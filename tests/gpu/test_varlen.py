"""flash_attn_varlen_func: sequences of different lengths packed into one tensor, forward and
backward, against an fp32 reference run per sequence."""

import pytest
import torch

from flashgen import backward, flash_attn_func, flash_attn_varlen_func
from flashgen.reference import GRADIENT_EPS, assert_close_fa2, attention_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = [torch.float16, torch.bfloat16]
# (query lengths, key lengths): empty sequences, one row, odd lengths, more keys than queries and
# fewer
LENGTHS = [
    ([1], [1]),
    ([17, 0, 130, 64], [17, 5, 130, 300]),
    ([300, 1, 77], [250, 0, 77]),
    ([513, 129], [513, 1024]),
]


def packed(lengths, heads, head_dim, dtype):
    t = torch.randn(sum(lengths), heads, head_dim, device="cuda").to(dtype)
    return t.requires_grad_()


def cu_seqlens(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def per_sequence(q, k, v, lengths_q, lengths_k, causal, dout, upcast):
    """out, lse (heads, total) and the gradients, from attention_ref on each sequence alone."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    outs, lses = [], []
    starts_q, starts_k = [0, *torch.tensor(lengths_q).cumsum(0).tolist()], \
        [0, *torch.tensor(lengths_k).cumsum(0).tolist()]
    for b in range(len(lengths_q)):
        sq, sk = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
        o, lse = attention_ref(q[sq][None], k[sk][None], v[sk][None], causal=causal,
                               upcast=upcast)
        outs.append(o[0])
        lses.append(lse[0])
    out = torch.cat(outs)
    out.backward(dout)
    return out, torch.cat(lses, dim=1), q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_more_sequences_and_empty_ones_find_their_own_blocks(causal, forward_family):
    """The backward's helper kernels (D, dQ's conversion) and the forward launch over the
    batch's own query blocks, not over a dense batch of the longest: each block finds its
    sequence by a binary search of cu_seqlens_q, here among 300, empty ones among them."""
    lengths = torch.randint(0, 60, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    lengths[150] = 700
    torch.manual_seed(0)
    q, k, v = (packed(lengths, heads, 128, torch.bfloat16) for heads in (4, 2, 2))
    cu = cu_seqlens(lengths)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref = per_sequence(q, k, v, lengths, lengths, causal, dout, upcast=True)
    same_dtype = per_sequence(q, k, v, lengths, lengths, causal, dout, upcast=False)
    assert_close_fa2(out, ref[0], same_dtype[0])
    for name, grad, r, s in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref[2:],
                                same_dtype[2:]):
        assert_close_fa2(grad, r, s, name=name, eps=GRADIENT_EPS)


@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda p: f"q{len(p[0])}seqs_{sum(p[0])}")
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)], ids=lambda h: f"h{h[0]}_hk{h[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
# 256: a hopper tile that stages its output over Q (no room for a buffer of its own)
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_matches_each_sequence_alone(dtype, head_dim, causal, heads, lengths, forward_family):
    torch.manual_seed(0)
    lengths_q, lengths_k = lengths
    q = packed(lengths_q, heads[0], head_dim, dtype)
    k, v = (packed(lengths_k, heads[1], head_dim, dtype) for _ in range(2))
    # max_seqlen larger than the longest: allowed, nothing past a sequence is computed
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_seqlens(lengths_q), cu_seqlens(lengths_k),
                                         max(lengths_q) + 3, max(lengths_k), causal=causal,
                                         return_attn_probs=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref = per_sequence(q, k, v, lengths_q, lengths_k, causal, dout, upcast=True)
    same_dtype = per_sequence(q, k, v, lengths_q, lengths_k, causal, dout, upcast=False)
    assert lse.shape == (heads[0], sum(lengths_q))
    assert_close_fa2(out, ref[0], same_dtype[0])
    assert_close_fa2(lse, ref[1], ref[1], name="lse", eps=1e-4)
    for name, grad, r, s in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref[2:],
                                same_dtype[2:]):
        assert_close_fa2(grad, r, s, name=name, eps=GRADIENT_EPS)


def test_equal_lengths_match_flash_attn_func_exactly(forward_family, monkeypatch):
    """The same kernels on the same rows: bit-identical outputs and gradients, on each family."""
    torch.manual_seed(0)
    batch, seqlen, heads, head_dim = 3, 200, 4, 64
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    cu = cu_seqlens([seqlen] * batch)
    packed_inputs = [t.detach().reshape(batch * seqlen, heads, head_dim).requires_grad_()
                     for t in (q, k, v)]
    out = flash_attn_func(q, k, v, causal=True, deterministic=True)
    out_varlen = flash_attn_varlen_func(*packed_inputs, cu, cu, seqlen, seqlen, causal=True,
                                        deterministic=True)
    # Both gradients on the family that takes a variable-length batch (the dense call's would
    # otherwise run on the hopper family's backward).
    monkeypatch.setenv("FLASHGEN_FAMILY", "mma")
    backward.clear_plans()
    dout = torch.randn_like(out)
    try:
        out.backward(dout)
        out_varlen.backward(dout.reshape(batch * seqlen, heads, head_dim))
    finally:
        backward.clear_plans()  # the plans made under the forced family
    assert torch.equal(out.reshape(-1, heads, head_dim), out_varlen)
    for grad, grad_varlen in zip((q.grad, k.grad, v.grad), (t.grad for t in packed_inputs)):
        assert torch.equal(grad.reshape(-1, heads, head_dim), grad_varlen)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_batch_repeated_at_one_signature_runs_its_kept_launch_on_each_calls_sequences(causal):
    """Batches of one sequence count and longest lengths are known calls (flashgen/attention.py):
    the first's kept params launched with each call's tensors and lengths, eager and in a CUDA
    graph whose lengths change between replays."""
    from flashgen import attention, forward

    forward.clear_plans()
    # one signature: the same totals (tensor shapes), sequence count and longest lengths
    batches = [([130, 17, 64], [130, 300, 5]), ([64, 130, 17], [300, 5, 130]),
               ([130, 0, 81], [1, 300, 134])]
    calls = []
    for lengths_q, lengths_k in batches:
        q, k, v = (packed(lengths, heads, 128, torch.bfloat16).detach()
                   for lengths, heads in ((lengths_q, 8), (lengths_k, 2), (lengths_k, 2)))
        calls.append(((q, k, v, cu_seqlens(lengths_q), cu_seqlens(lengths_k)),
                      (lengths_q, lengths_k)))
    with torch.no_grad():
        outs = [flash_attn_varlen_func(*tensors, 130, 300, causal=causal,
                                       return_softmax_lse=True) for tensors, _ in calls]
        assert len(forward._kept) == 1 and len(attention._known) == 1
        graph_inputs = [t.clone() for t in calls[0][0]]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out = flash_attn_varlen_func(*graph_inputs, 130, 300, causal=causal)
    replayed = ([130, 17, 64], [250, 5, 180])
    fresh = (*(packed(lengths, heads, 128, torch.bfloat16).detach()
               for lengths, heads in ((replayed[0], 8), (replayed[1], 2), (replayed[1], 2))),
             cu_seqlens(replayed[0]), cu_seqlens(replayed[1]))
    for t, value in zip(graph_inputs, fresh):
        t.copy_(value)
    graph.replay()
    checks = [(tensors, lengths, out) for ((tensors, lengths), (out, _)) in zip(calls, outs)]
    checks.append((fresh, replayed, graph_out))
    for (q, k, v, _, _), (lengths_q, lengths_k), out in checks:
        dout = torch.zeros_like(q)
        ref = per_sequence(q, k, v, lengths_q, lengths_k, causal, dout, upcast=True)[0]
        same_dtype = per_sequence(q, k, v, lengths_q, lengths_k, causal, dout, upcast=False)[0]
        assert_close_fa2(out, ref, same_dtype, "out")


def test_a_training_step_compiles_without_graph_breaks():
    torch.manual_seed(0)
    lengths = [100, 37, 0, 64]
    q, k, v = (packed(lengths, 4, 64, torch.float16) for _ in range(3))
    cu = cu_seqlens(lengths)

    def step(q, k, v):
        out = flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True)
        return (out.float() ** 2).sum()

    expected = step(q, k, v)
    expected_grads = torch.autograd.grad(expected, (q, k, v))
    loss = torch.compile(step, fullgraph=True)(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    torch.testing.assert_close(loss, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


def _bad(change):
    lengths = [5, 7]
    q, k, v = (torch.randn(12, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    arguments = dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens(lengths),
                     cu_seqlens_k=cu_seqlens(lengths), max_seqlen_q=7, max_seqlen_k=7)
    change(arguments)
    return arguments


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].long()), "cu_seqlens_q must be int32"),
    (lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"][:2]), "same length"),
    (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].cpu()), "cu_seqlens_q is on cpu"),
    (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"][None]), "must be 1-D"),
    (lambda a: a.update(max_seqlen_q=-1), "max_seqlen_q must be an int >= 0"),
    (lambda a: a.update(q=a["q"][None]), r"q must be \(total, nheads, headdim\)"),
    (lambda a: a.update(k=a["k"][:, :3], v=a["v"][:, :3]), "multiple of"),
    (lambda a: a.update(block_table=a["cu_seqlens_q"]), "block_table"),
    (lambda a: a.update(dropout_p=1.5), r"dropout_p must be a number in \[0, 1\)"),
])
def test_bad_input_names_the_argument(change, message):
    with pytest.raises((ValueError, TypeError, NotImplementedError), match=message):
        flash_attn_varlen_func(**_bad(change))


@pytest.mark.parametrize("change, message", [
    (lambda a: a["cu_seqlens_q"].copy_(torch.tensor([0, 7, 5])), "must not decrease|end at"),
    (lambda a: a["cu_seqlens_k"].copy_(torch.tensor([1, 5, 12])), "start at 0"),
    (lambda a: a.update(max_seqlen_k=6), "more than max_seqlen_k=6"),
])
def test_debug_checks_read_device_values(change, message, monkeypatch):
    monkeypatch.setenv("FLASHGEN_DEBUG_CHECKS", "1")
    with pytest.raises(ValueError, match=message):
        flash_attn_varlen_func(**_bad(change))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqused_k_attends_to_the_first_keys_of_each_run(causal):
    """FlashAttention-3's seqused_k: sequence b sees the first seqused_k[b] keys of its run in
    cu_seqlens_k (the rest hold NaN here: reading one shows; so a family whose loads stop at the
    last used key runs it), forward only."""
    lengths_q, runs, used = [37, 1, 200], [300, 64, 256], [250, 0, 256]
    heads, heads_kv, head_dim, dtype = 8, 2, 128, torch.bfloat16
    q = torch.randn(sum(lengths_q), heads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(runs), heads_kv, head_dim, device="cuda", dtype=dtype)
            for _ in range(2))
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(runs)
    for t in (k, v):
        for start, run, n in zip(cu_k.tolist(), runs, used):
            t[start + n:start + run] = float("nan")
    seqused_k = torch.tensor(used, dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(runs), causal=causal,
                                 seqused_k=seqused_k)
    for b, (qs, ks) in enumerate(zip(cu_q.tolist()[:-1], cu_k.tolist()[:-1])):
        rows = slice(qs, qs + lengths_q[b])
        keys = slice(ks, ks + used[b])
        args = (q[rows].unsqueeze(0), k[keys].unsqueeze(0), v[keys].unsqueeze(0))
        ref, _ = attention_ref(*args, causal=causal)
        same_dtype, _ = attention_ref(*args, causal=causal, upcast=False)
        assert_close_fa2(out[rows].unsqueeze(0), ref, same_dtype, f"out of sequence {b}")
    with pytest.raises(NotImplementedError, match="seqused_k is forward only"):
        flash_attn_varlen_func(q.requires_grad_(), k, v, cu_q, cu_k, max(lengths_q), max(runs),
                               seqused_k=seqused_k)
