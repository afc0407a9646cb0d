"""flashgen.compat, the `flash_attn` package FlashAttention-2's users import: what install()
makes importable, and its helpers, checked on the CPU."""

import math
import sys
import types

import pytest
import torch

import flashgen
from flashgen import compat, packed
from flashgen.compat import bert_padding, flash_attn_interface
from flashgen.compat.layers.rotary import apply_rotary_emb


def test_install_makes_flash_attn_and_its_submodules_import_flashgen(monkeypatch):
    for name in list(sys.modules):
        if name == "flash_attn" or name.startswith("flash_attn."):
            monkeypatch.delitem(sys.modules, name)
    compat.install()
    import flash_attn
    from flash_attn.bert_padding import pad_input
    from flash_attn.flash_attn_interface import flash_attn_varlen_func
    from flash_attn.layers.rotary import apply_rotary_emb as rotary

    assert flash_attn.flash_attn_func is flash_attn_interface.flash_attn_func
    assert flash_attn_varlen_func is flash_attn_interface.flash_attn_varlen_func
    assert pad_input is bert_padding.pad_input
    assert rotary is apply_rotary_emb
    compat.install()  # twice is harmless


def test_install_refuses_when_another_flash_attn_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    with pytest.raises(RuntimeError, match="already imported"):
        compat.install()


def test_flashgen_exports_the_packed_functions():
    for name in ("flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
                 "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"):
        assert name in flashgen.__all__
        assert getattr(flashgen, name) is getattr(packed, name)


def test_packed_tensors_are_split_into_views_not_copies():
    qkv = torch.randn(2, 5, 3, 4, 8)
    q, k, v = packed._unpack("qkv", qkv, 3, dim=2)
    assert q.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert torch.equal(k, qkv[:, :, 1]) and q.stride(-1) == 1
    with pytest.raises(ValueError, match=r"qkv must be \(batch, seqlen, 3, nheads, headdim\)"):
        packed._unpack("qkv", torch.randn(2, 5, 2, 4, 8), 3, dim=2)
    with pytest.raises(ValueError, match=r"kv must be \(total, 2, nheads, headdim\)"):
        packed._unpack("kv", torch.randn(5, 4, 8), 2, dim=1)


def test_lse_of_a_row_without_keys_is_fa2s_plus_infinity():
    lse = torch.tensor([[0.5, -math.inf]])
    out, converted, s_dmask = flash_attn_interface._with_fa2_lse((lse, lse, None), True)
    assert converted.tolist() == [[0.5, math.inf]] and s_dmask is None


def test_unpad_and_pad_round_trip():
    x = torch.randn(3, 6, 2, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    rows, indices, cu_seqlens, max_seqlen, seqused = bert_padding.unpad_input(x, mask)
    assert rows.shape == (10, 2, 4)
    assert cu_seqlens.tolist() == [0, 3, 9, 10] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 6 and seqused.tolist() == [3, 6, 1]
    padded = bert_padding.pad_input(rows, indices, 3, 6)
    assert torch.equal(padded, x * mask[..., None, None])


def test_unpad_keeps_unused_tokens_in_the_rows_but_not_in_seqused():
    x = torch.randn(1, 4, 1, 2)
    rows, _, cu_seqlens, _, seqused = bert_padding.unpad_input(
        x, torch.tensor([[1, 1, 0, 0]]), unused_mask=torch.tensor([[0, 0, 1, 0]]))
    assert rows.shape[0] == 3 and cu_seqlens.tolist() == [0, 3] and seqused.tolist() == [2]


def test_concatenated_sequences_unpad_each_sequence():
    x = torch.randn(2, 4, 1, 2)
    rows, indices, cu_seqlens, max_seqlen = bert_padding.unpad_input_for_concatenated_sequences(
        x, torch.tensor([[2, 1, 0, 0], [4, 0, 0, 0]]))
    assert cu_seqlens.tolist() == [0, 2, 3, 7] and max_seqlen == 4
    assert indices.tolist() == [0, 1, 2, 4, 5, 6, 7]


def _rotate_reference(x, cos, sin, interleaved, offset):
    """Each column pair as a complex number times e^(i * angle)."""
    rotary_dim = 2 * cos.shape[-1]
    out = x.clone().double()
    for t in range(x.shape[1]):
        c, s = cos[t + offset].double(), sin[t + offset].double()
        head = x[:, t, :, :rotary_dim].double()
        if interleaved:
            a, b = head[..., 0::2], head[..., 1::2]
        else:
            a, b = head[..., :rotary_dim // 2], head[..., rotary_dim // 2:]
        z = torch.complex(a, b) * torch.complex(c, s)
        if interleaved:
            out[:, t, :, 0:rotary_dim:2], out[:, t, :, 1:rotary_dim:2] = z.real, z.imag
        else:
            out[:, t, :, :rotary_dim // 2], out[:, t, :, rotary_dim // 2:rotary_dim] = z.real, z.imag
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offset", [0, 3])
def test_rotary_rotates_the_first_rotary_dim_columns(interleaved, offset):
    x = torch.randn(2, 5, 3, 16)
    angles = torch.rand(12, 4) * 6
    out = apply_rotary_emb(x, angles.cos(), angles.sin(), interleaved, seqlen_offsets=offset)
    torch.testing.assert_close(out.double(), _rotate_reference(x, angles.cos(), angles.sin(),
                                                               interleaved, offset))
    assert torch.equal(out[..., 8:], x[..., 8:])


def test_rotary_takes_an_offset_per_sequence():
    x = torch.randn(2, 3, 1, 8)
    angles = torch.rand(10, 4)
    out = apply_rotary_emb(x, angles.cos(), angles.sin(), seqlen_offsets=torch.tensor([0, 4]))
    for b, offset in enumerate((0, 4)):
        expected = apply_rotary_emb(x[b:b + 1], angles.cos(), angles.sin(), seqlen_offsets=offset)
        torch.testing.assert_close(out[b:b + 1], expected)


# FlashAttention-2 2.8's private functions, as ring attention calls them.
FA2_PRIVATE_ARGUMENTS = {
    "_flash_attn_forward": ["q", "k", "v", "dropout_p", "softmax_scale", "causal",
                            "window_size_left", "window_size_right", "softcap", "alibi_slopes",
                            "return_softmax"],
    "_flash_attn_backward": ["dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv",
                             "dropout_p", "softmax_scale", "causal", "window_size_left",
                             "window_size_right", "softcap", "alibi_slopes", "deterministic",
                             "rng_state"],
}


def ring_call(function, **given):
    """A call as ring-flash-attn builds it (its get_default_args): every argument that
    inspect.getfullargspec lists, None where it has no default and softcap 0, then its own."""
    import inspect

    spec = inspect.getfullargspec(function)
    defaults = spec.defaults or ()
    arguments = dict(zip(spec.args, (None,) * (len(spec.args) - len(defaults)) + defaults))
    if "softcap" in arguments:
        arguments["softcap"] = 0.0
    return function(**{**arguments, **given})


@pytest.mark.parametrize("name", FA2_PRIVATE_ARGUMENTS)
def test_the_private_functions_show_fa2s_arguments_to_getfullargspec(name):
    import inspect

    assert inspect.getfullargspec(getattr(flash_attn_interface, name)).args == (
        FA2_PRIVATE_ARGUMENTS[name])


def test_ring_attentions_calls_of_the_private_functions_reach_the_kernels(monkeypatch):
    """zigzag ring attention's per-block forward and backward (ring-flash-attn), on the CPU with
    the kernels mocked: the arguments it passes are the ones flashgen takes, and the gradients
    land in the views of its buffers it hands in."""
    from tests import kernel_mock

    record = kernel_mock.install(monkeypatch)
    q, k, v = (torch.randn(1, 48, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    out, lse, _, _ = ring_call(flash_attn_interface._flash_attn_forward, q=q, k=k, v=v,
                               dropout_p=0.0, softmax_scale=0.125, causal=True,
                               alibi_slopes=None, return_softmax=False, window_size_left=-1,
                               window_size_right=-1)
    assert out.shape == q.shape and lse.shape == (1, 2, 48)
    buffers = [torch.zeros(1, 96, 2, 64, dtype=torch.bfloat16) for _ in range(3)]
    views = [b[:, :48] for b in buffers]
    ring_call(flash_attn_interface._flash_attn_backward, dout=torch.randn_like(out), q=q, k=k,
              v=v, out=out, softmax_lse=lse, dq=views[0], dk=views[1], dv=views[2],
              dropout_p=0.0, softmax_scale=0.125, causal=True, alibi_slopes=None,
              deterministic=False, window_size_left=-1, window_size_right=-1)
    assert [entry for entry, _ in record.launches] == ["fwd", "bwd"]
    assert all(not b[:, 48:].any() for b in buffers)  # past the views: untouched
