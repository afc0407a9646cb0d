"""A dense forward or backward repeated at one shape launches the params its first call filled
(flashgen/forward.py's and backward.py's kept launches), with each call's own tensors: the same
fields as a call planned afresh but for the addresses, and none kept where the call's tensors
were copied, are one another, or its modifiers hold tensors. The real Python path on a CPU
(tests/kernel_mock.py)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

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
    """Nor do they run the launch kept for a plain call of the same shapes."""
    from flashgen import attention

    q, k, v = qkv()
    flash_attn_func(q, k, v)
    slopes = [torch.rand(4, dtype=torch.float32) for _ in range(2)]
    for s in slopes:
        flash_attn_func(q, k, v, alibi_slopes=s)
    assert ([launch["alibi_slopes"] for launch in launches()]
            == [0, *(s.data_ptr() for s in slopes)])
    assert len(forward._kept) == len(attention._known) == 1


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


# --- the compiled replay of the kept backwards ----------------------------------------------

@pytest.fixture
def compiled_replay(monkeypatch):
    """A loaded stand-in for the compiled replay's module (flashgen/replay.py), the backward's
    replay on (as FLASHGEN_REPLAY_BACKWARD=1 turns it on): it records what is offered to
    keep_backward and what backward() gets, and returns `.gradients` from backward() (None, so
    Python runs the call, until a test sets them)."""
    from flashgen import replay

    stand_in = SimpleNamespace(kept=[], calls=[], gradients=None)

    def replayed_backward(*arguments):
        stand_in.calls.append(arguments)
        return stand_in.gradients

    module = SimpleNamespace(
        decode=lambda *a: None, forward=lambda *a: None, backward=replayed_backward,
        keep_decode=lambda *a: True, keep_forward=lambda *a: True,
        keep_backward=lambda *a: stand_in.kept.append(a) or True, forget=lambda: None)
    monkeypatch.setattr(replay, "_module", module)
    for name in ("decode", "forward", "backward"):
        monkeypatch.setattr(replay, name, getattr(module, name))
    return stand_in


def test_a_kept_backward_is_offered_once_with_its_inputs_places(record, compiled_replay):
    first = trained(qkv())
    (offered,) = compiled_replay.kept
    given, pairs, launches, roles, grads_like, scratch, heads_first, q_position = offered
    sources, positions = pairs[0::2], pairs[1::2]
    assert sources == list(range(6)) and roles == backward.REPLAY_ROLES and not heads_first
    assert [given[p].data_ptr() for p in positions] == [
        first[name].data_ptr() for name in ("q", "k", "v", "o", "dout", "softmax_lse")]
    assert list(grads_like) == positions[:3] and q_position == positions[0] and scratch > 0
    trained(qkv())  # the stand-in replays nothing: Python launches, and offers nothing again
    assert len(compiled_replay.kept) == 1 and len(compiled_replay.calls) == 2


def test_the_replays_patches_give_the_kept_launch_of_each_calls_own_tensors(record,
                                                                              compiled_replay):
    """The compiled replay sets each patched member to its source's address plus its offset:
    that gives what backward.py's Python path launches with the same tensors and scratch."""
    trained(qkv())
    taken(record, "bwd")
    tensors = trained(qkv())
    (launched,) = taken(record, "bwd")
    ((_, _, fields, patches),), roles, _ = backward.replay_parts(*backward._kept.values())
    names = params.BwdArgs._fields
    sources = [tensors[name].data_ptr() for name in (
        "q", "k", "v", "o", "dout", "softmax_lse", "dq", "dk", "dv")]
    scratch_bases = set()
    for index, source, offset in zip(patches[0::3], patches[1::3], patches[2::3]):
        if source == backward.REPLAY_SCRATCH:
            scratch_bases.add(launched[names[index]] - offset)
        else:
            assert launched[names[index]] == sources[source] + offset, names[index]
    assert len(scratch_bases) == 1  # one scratch tensor at the recorded offsets
    patched = set(patches[0::3])
    assert all(fields[i] == launched[names[i]] for i in range(len(names)) if i not in patched)


def test_a_replayed_backward_hands_its_gradients_to_autograd(record, compiled_replay):
    trained(qkv())
    gradients = tuple(torch.full(t.shape, float(i), dtype=t.dtype)
                      for i, t in enumerate(qkv()))
    compiled_replay.gradients = gradients
    record.launches.clear()
    tensors = trained(qkv())
    assert not taken(record, "bwd")  # nothing launched from Python
    for name, expected in zip(("dq", "dk", "dv"), gradients):
        assert torch.equal(tensors[name], expected)
    from flashgen.op_schema import SAVED
    assert compiled_replay.calls[-1][SAVED.replayed[4]].data_ptr() == tensors["dout"].data_ptr()


def test_no_backward_is_offered_where_dout_was_copied_or_a_modifier_holds_tensors(
        record, compiled_replay):
    q, k, v = (t.requires_grad_() for t in qkv())
    flash_attn_func(q, k, v).sum().backward()  # an expanded dout: the kernel reads a copy
    out = flash_attn_func(q, k, v, alibi_slopes=torch.rand(4, dtype=torch.float32))
    out.backward(torch.randn_like(out))
    assert not compiled_replay.kept


def test_clear_plans_forgets_what_the_compiled_replay_kept_of_the_backwards(record):
    from flashgen import replay

    generation = replay.generation
    backward.clear_plans()
    assert replay.generation == generation + 1


# --- flash_attn_func's known calls ---------------------------------------------------------

def counted_calls(monkeypatch, name: str) -> list:
    """One entry per call of flashgen.attention's `name` (the checks of a call) from now on."""
    from flashgen import attention

    count, real = [], getattr(attention, name)
    monkeypatch.setattr(attention, name, lambda *a, **k: count.append(1) or real(*a, **k))
    return count


@pytest.fixture
def checked(monkeypatch):
    """How many flash_attn_func calls ran their checks (attention.dense_arguments)."""
    return counted_calls(monkeypatch, "dense_arguments")


def test_a_known_call_skips_its_checks_and_launches_on_its_own_tensors(launches, checked):
    flash_attn_func(*qkv(), causal=True)
    (planned,) = launches()
    again = qkv()
    out, lse, _ = flash_attn_func(*again, causal=True, return_attn_probs=True)
    (direct,) = launches()
    assert len(checked) == 1
    assert without_addresses(direct) == without_addresses(planned)
    assert [direct[name] for name in ADDRESSES[:5]] == [
        *(t.data_ptr() for t in again), out.data_ptr(), lse.data_ptr()]


def test_a_known_call_whose_inputs_require_grad_records_autograd_where_grad_is_enabled(
        launches, checked):
    q, k, v = (t.requires_grad_() for t in qkv())
    with torch.no_grad():
        flash_attn_func(q, k, v)
        assert flash_attn_func(q, k, v).grad_fn is None
    assert len(checked) == 1
    out = flash_attn_func(q, k, v)
    assert out.grad_fn is not None and len(checked) == 2


def test_a_known_call_goes_through_the_op_where_something_sees_ops(launches, checked,
                                                                   monkeypatch):
    from flashgen import attention

    flash_attn_func(*qkv())
    through_op = []
    monkeypatch.setattr(attention.ops, "nothing_sees_ops", lambda: False)
    monkeypatch.setattr(attention.ops, "attention",
                        lambda q, *a, **k: through_op.append(1) or (q, None))
    flash_attn_func(*qkv())
    assert len(checked) == 2 and through_op == [1]


def test_another_signature_is_checked_again(launches, checked):
    q, k, v = qkv()
    flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match="head"):
        flash_attn_func(q, k[..., :32], v)  # another head dim for k
    assert len(checked) == 2


def test_clear_plans_forgets_the_known_calls_and_the_compiled_replays(launches):
    from flashgen import attention, replay

    flash_attn_func(*qkv())
    assert attention._known
    generation = replay.generation
    forward.clear_plans()
    assert not attention._known
    assert replay.generation == generation + 1  # what the compiled replay kept is dropped too


# --- flash_attn_varlen_func's known calls ----------------------------------------------------

SEQUENCES = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k")


def packed(total_q=40, total_k=56, heads=4, heads_kv=2, dim=64):
    return (torch.randn(total_q, heads, dim, dtype=torch.bfloat16),
            *(torch.randn(total_k, heads_kv, dim, dtype=torch.bfloat16) for _ in range(2)))


def cumulative(*lengths):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


@pytest.fixture
def checked_varlen(monkeypatch):
    """How many flash_attn_varlen_func calls ran their checks (attention.varlen_arguments)."""
    return counted_calls(monkeypatch, "varlen_arguments")


@pytest.mark.parametrize("used", [False, True], ids=["cu_seqlens", "seqused_k"])
def test_a_known_varlen_call_launches_on_its_own_tensors_and_sequences(launches,
                                                                       checked_varlen, used):
    """Another batch of the same sequence count and longest lengths: its own lengths' tensors
    (read on the device only), checks skipped."""
    from flashgen import flash_attn_varlen_func

    def call(lengths_q, lengths_k):
        cu_q, cu_k = cumulative(*lengths_q), cumulative(*lengths_k)
        used_k = torch.tensor(lengths_k, dtype=torch.int32) if used else None
        tensors = packed()
        with torch.no_grad():
            out, lse = flash_attn_varlen_func(*tensors, cu_q, cu_k, 25, 30, causal=True,
                                              seqused_k=used_k, return_softmax_lse=True)
        return tensors, (cu_q, cu_k, used_k), out, lse

    call((15, 25), (26, 30))
    (planned,) = launches()
    tensors, sequences, out, lse = call((25, 15), (30, 26))
    (direct,) = launches()
    assert len(checked_varlen) == 1
    addresses = (*ADDRESSES[:5], *SEQUENCES)
    assert ({name: value for name, value in direct.items() if name not in addresses}
            == {name: value for name, value in planned.items() if name not in addresses})
    own = [*(t.data_ptr() for t in tensors), out.data_ptr(), lse.data_ptr(),
           *(0 if t is None else t.data_ptr() for t in sequences)]
    assert [direct[name] for name in addresses] == own
    assert out.shape == tensors[0].shape and lse.shape == (4, 40)


def test_another_longest_length_or_sequence_count_is_checked_again(launches, checked_varlen):
    from flashgen import flash_attn_varlen_func

    for cu_q, cu_k, longest in ((cumulative(15, 25), cumulative(26, 30), 25),
                                (cumulative(15, 25), cumulative(26, 30), 26),
                                (cumulative(10, 10, 20), cumulative(16, 10, 30), 25)):
        with torch.no_grad():
            flash_attn_varlen_func(*packed(), cu_q, cu_k, longest, 30)
    assert len(checked_varlen) == 3


def test_debug_checks_check_every_varlen_call(launches, checked_varlen, monkeypatch):
    from flashgen import flash_attn_varlen_func

    monkeypatch.setenv("FLASHGEN_DEBUG_CHECKS", "1")
    for _ in range(2):
        with torch.no_grad():
            flash_attn_varlen_func(*packed(), cumulative(15, 25), cumulative(26, 30), 25, 30)
    assert len(checked_varlen) == 2
