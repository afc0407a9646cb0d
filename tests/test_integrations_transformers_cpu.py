"""flashgen.integrations.transformers on a CPU: register() makes attn_implementation="flashgen" a
transformers attention implementation, and transformers' own flash-attention flow calls
flashgen's functions with FlashAttention-2's arguments (flashgen's functions record what they
get)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import flashgen  # noqa: E402
from flashgen.integrations import transformers as flashgen_transformers  # noqa: E402
from tests import kernel_mock  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers import modeling_flash_attention_utils as flash_utils  # noqa: E402
from transformers.integrations.flash_attention import flash_attention_forward  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

HEADS, HEADS_KV, HEAD_DIM = 4, 2, 64
TAKES_SINKS = "s_aux" in inspect.signature(flashgen.flash_attn_varlen_func).parameters


@pytest.fixture(autouse=True)
def registered():
    flashgen_transformers.register()


def test_register_names_flashgen_where_transformers_names_flash_attention_2():
    flashgen_transformers.register()  # again: nothing changes
    assert ALL_ATTENTION_FUNCTIONS["flashgen"] is ALL_ATTENTION_FUNCTIONS["flash_attention_2"]
    assert (ALL_MASK_ATTENTION_FUNCTIONS["flashgen"]
            is ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
    names = ALL_ATTENTION_FUNCTIONS.valid_keys()
    assert ("paged|flashgen" in names) == ("paged|flash_attention_2" in names)
    assert flash_utils._lazy_imports.serves_flashgen


def test_transformers_loads_flashgens_functions_and_passes_what_they_take(monkeypatch):
    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    functions, processors = flash_utils.lazy_import_flash_attention("flashgen")
    assert [inspect.unwrap(f) for f in functions[:3]] == [
        flashgen.flash_attn_func, flashgen.flash_attn_varlen_func,
        flashgen.flash_attn_with_kvcache]
    # 5.24 processes the kwargs of the varlen and the KV-cache functions apart, 5.17 of one
    varlen_kwargs = processors[0] if isinstance(processors, tuple) else processors
    supported = varlen_kwargs.keywords["supports_mapping"]
    for name in ("dropout_p", "softmax_scale", "window_size", "softcap", "deterministic",
                 "max_seqlen_q", "max_seqlen_k"):
        assert supported[name], name
    assert supported["s_aux"] == TAKES_SINKS


def tiny_llama() -> LlamaConfig:
    return LlamaConfig(hidden_size=HEADS * HEAD_DIM, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=HEADS, num_key_value_heads=HEADS_KV, vocab_size=128)


def test_models_load_with_flashgen_and_switch_to_it(tmp_path):
    model = AutoModelForCausalLM.from_config(tiny_llama(), attn_implementation="flashgen")
    assert model.config._attn_implementation == "flashgen"
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="flashgen")
    assert loaded.config._attn_implementation == "flashgen"
    switched = AutoModelForCausalLM.from_config(tiny_llama(), attn_implementation="sdpa")
    switched.set_attn_implementation("flashgen")
    assert switched.config._attn_implementation == "flashgen"


@pytest.mark.skipif(not TAKES_SINKS, reason="flashgen's functions take no sinks (s_aux)")
def test_sink_models_accept_flashgen():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssPreTrainedModel

    assert "flashgen" in GptOssPreTrainedModel._compatible_flash_implementations


@pytest.fixture
def calls(monkeypatch):
    """flashgen's two functions record their arguments by name and return zeros shaped like q;
    transformers loads them afresh."""
    record = SimpleNamespace(dense=[], varlen=[])
    for name, calls_of in (("flash_attn_func", record.dense),
                           ("flash_attn_varlen_func", record.varlen)):
        monkeypatch.setattr(flashgen, name, kernel_mock._recording(
            calls_of, getattr(flashgen, name), lambda a: torch.zeros_like(a["q"])))
    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    return record


def attend(seqlen=5, batch=2, **kwargs):
    """transformers' flash-attention function on a causal layer, (batch, heads, seq, dim)
    inputs as a model's attention module passes them."""
    module = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flashgen"),
                             is_causal=True, layer_idx=0)
    q = torch.randn(batch, HEADS, seqlen, HEAD_DIM).to(torch.bfloat16)
    k, v = (torch.randn(batch, HEADS_KV, seqlen, HEAD_DIM).to(torch.bfloat16) for _ in "kv")
    kwargs.setdefault("attention_mask", None)
    out, _ = flash_attention_forward(module, q, k, v, scaling=0.125, **kwargs)
    return q, out


def test_a_batch_without_padding_runs_flash_attn_func_causal_with_gqa(calls):
    q, out = attend()
    (call,) = calls.dense
    assert torch.equal(call["q"], q.transpose(1, 2)) and call["k"].shape[2] == HEADS_KV
    assert (call["causal"], call["softmax_scale"], call["dropout_p"]) == (True, 0.125, 0.0)
    assert call["window_size"] == (-1, -1) and call["softcap"] == 0.0
    assert out.shape == (2, 5, HEADS, HEAD_DIM)


def test_a_padding_mask_unpads_to_flash_attn_varlen_func(calls):
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # left padding, as in generate()
    _, out = attend(attention_mask=mask)
    (call,) = calls.varlen
    assert call["q"].shape == (8, HEADS, HEAD_DIM) and call["causal"]
    assert call["cu_seqlens_q"].tolist() == [0, 3, 8] and call["max_seqlen_q"] == 5
    assert out.shape == (2, 5, HEADS, HEAD_DIM)


def test_packed_sequences_run_varlen_from_position_ids_or_cu_seq_lens(calls):
    attend(batch=1, position_ids=torch.tensor([[0, 1, 2, 0, 1]]))
    attend(batch=1, cu_seq_lens_q=torch.tensor([0, 2, 5], dtype=torch.int32),
           cu_seq_lens_k=torch.tensor([0, 2, 5], dtype=torch.int32), max_length_q=3,
           max_length_k=3)
    from_positions, from_lengths = calls.varlen
    assert from_positions["cu_seqlens_q"].tolist() == [0, 3, 5]
    assert from_positions["max_seqlen_q"] == from_positions["max_seqlen_k"] == 3
    assert isinstance(from_positions["max_seqlen_q"], int)  # transformers passes a 0-d tensor
    assert from_lengths["cu_seqlens_k"].tolist() == [0, 2, 5]


def test_windows_softcap_and_dropout_pass_as_flash_attention_2s(calls):
    attend(sliding_window=3, softcap=30.0, dropout=0.1)
    (call,) = calls.dense
    # transformers' window counts the query itself: 3 keys are the query and 2 before it
    assert call["window_size"] == (2, 2) and call["causal"]
    assert call["softcap"] == 30.0 and call["dropout_p"] == 0.1


@pytest.mark.skipif(not TAKES_SINKS, reason="flashgen's functions take no sinks (s_aux)")
def test_sinks_reach_flashgen_in_fp32(calls):
    attend(s_aux=torch.randn(HEADS))
    (call,) = calls.dense
    assert call["s_aux"].dtype == torch.float32 and call["s_aux"].shape == (HEADS,)
