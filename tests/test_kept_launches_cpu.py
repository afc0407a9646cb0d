"""A dense forward or backward repeated at one shape launches the params its first call filled
(flashgen/forward.py's and backward.py's kept launches), with each call's own tensors: the same
fields as a call planned afresh but for the addresses, and none kept where the call's tensors
were copied, are one another, or its modifiers hold tensors. The real Python path on a CPU
(tests/kernel_mock.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from codegen import params  # noqa: E402
from flashgen import backward, flash_attn_func, forward  # noqa: E402
from tests import kernel_mock  # noqa: E402

ADDRESSES = ("q", "k", "v", "o", "softmax_lse", "tile_counter")


@pytest.fixture
def record(monkeypatch):
    return kernel_mock.install(monkeypatch)


def taken(record, entry: str = "fwd") -> list[dict]:
    """The launches' fields by name since the last look, of that entry."""
    names = (params.FwdArgs if entry == "fwd" else params.BwdArgs)._fields
    fields = [dict(zip(names, args[2:])) for kind, args in record.launches if kind == entry]
    record.launches.clear()
    return fields


@pytest.fixture
def launches(record):
    """The fwd launches' fields by name, each list taken once."""
    return lambda: taken(record)


def qkv(batch=2, seqlen_q=40, seqlen_k=56, heads=4, heads_kv=2, dim=64):
    return (torch.randn(batch, seqlen_q, heads, dim, dtype=torch.bfloat16),
            *(torch.randn(batch, seqlen_k, heads_kv, dim, dtype=torch.bfloat16)
              for _ in range(2)))


def without_addresses(fields: dict) -> dict:
    return {name: value for name, value in fields.items() if name not in ADDRESSES}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_repeated_call_launches_the_kept_params_on_its_own_tensors(launches, causal):
    q, k, v = qkv()
    flash_attn_func(q, k, v, causal=causal, softcap=5.0)
    (planned,) = launches()
    assert len(forward._kept) == 1
    again = qkv()
    out, lse, _ = flash_attn_func(*again, causal=causal, softcap=5.0, return_attn_probs=True)
    (kept,) = launches()
    assert without_addresses(kept) == without_addresses(planned)
    own = dict(zip(ADDRESSES, (*(t.data_ptr() for t in again), out.data_ptr(),
                               lse.data_ptr())))
    assert {name: kept[name] for name in own} == own
    assert out.shape == again[0].shape and lse.shape == (2, 4, 40)


def test_another_shape_scale_or_mask_is_planned_apart(launches):
    q, k, v = qkv()
    flash_attn_func(q, k, v)
    flash_attn_func(q, k, v, softmax_scale=0.5)
    flash_attn_func(q, k, v, causal=True)
    flash_attn_func(*qkv(seqlen_q=41))
    plain, scaled, causal, longer = launches()
    assert scaled["softmax_scale"] == 0.5 and plain["softmax_scale"] == 64 ** -0.5
    assert causal["mask_offset"] == 16 and longer["seqlen_q"] == 41
    assert len(forward._kept) == 4


def test_an_unaligned_call_of_a_kept_signature_is_copied_to_an_aligned_one(launches):
    q, k, v = qkv()
    flash_attn_func(q, k, v)
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    assert shifted.stride() == q.stride() and shifted.data_ptr() % 16
    flash_attn_func(shifted, k, v)
    assert [launch["q"] % 16 for launch in launches()] == [0, 0]


def test_calls_with_tensors_among_their_modifiers_keep_no_launch(launches):
    q, k, v = qkv()
    slopes = [torch.rand(4, dtype=torch.float32) for _ in range(2)]
    for s in slopes:
        flash_attn_func(q, k, v, alibi_slopes=s)
    assert [launch["alibi_slopes"] for launch in launches()] == [s.data_ptr() for s in slopes]
    assert not forward._kept


def test_clear_plans_forgets_the_kept_launches(launches):
    flash_attn_func(*qkv())
    forward.clear_plans()
    assert not forward._kept


# --- the backward -------------------------------------------------------------------------

BWD_TENSORS = ("q", "k", "v", "o", "dout", "dq", "dk", "dv", "softmax_lse")
BWD_SCRATCH = ("dq_accum", "softmax_d", "dkv_accum")


def trained(qkv_tensors, causal=False, deterministic=False):
    q, k, v = (t.requires_grad_() for t in qkv_tensors)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                  return_attn_probs=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    return {"q": q, "k": k, "v": v, "o": out, "dout": dout, "dq": q.grad, "dk": k.grad,
            "dv": v.grad, "softmax_lse": lse}


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_a_repeated_backward_launches_the_kept_params_on_its_own_tensors(record, deterministic):
    trained(qkv(), deterministic=deterministic)
    (planned,) = taken(record, "bwd")
    assert len(backward._kept) == 1
    tensors = trained(qkv(), deterministic=deterministic)
    (kept,) = taken(record, "bwd")
    assert {name: kept[name] for name in BWD_TENSORS} == {
        name: t.data_ptr() for name, t in tensors.items()}
    scratch = [name for name in BWD_SCRATCH if planned[name]]
    assert scratch and all(kept[name] for name in scratch)
    # the scratch's pieces at the same offsets from the first
    assert ([kept[name] - kept[scratch[0]] for name in scratch]
            == [planned[name] - planned[scratch[0]] for name in scratch])
    same = set(BWD_TENSORS) | set(BWD_SCRATCH)
    assert ({n: v for n, v in kept.items() if n not in same}
            == {n: v for n, v in planned.items() if n not in same})


def test_a_backward_whose_tensors_are_one_another_keeps_no_launch(record):
    q, k, _ = qkv()
    k.requires_grad_()
    out = flash_attn_func(q.requires_grad_(), k, k)  # v is k
    out.backward(torch.randn_like(out))
    assert not backward._kept


def test_another_mask_or_determinism_keeps_a_backward_of_its_own(record):
    for causal, deterministic in ((False, False), (True, False), (False, True)):
        trained(qkv(), causal=causal, deterministic=deterministic)
    assert len(backward._kept) == 3
    plain, causal, deterministic = taken(record, "bwd")
    assert causal["mask_offset"] == 16 and not deterministic["dq_accum"]


def test_clear_plans_forgets_the_kept_backwards(record):
    trained(qkv())
    backward.clear_plans()
    assert not backward._kept
