"""flashgen as an attention implementation of Hugging Face transformers.

    import flashgen.integrations.transformers
    flashgen.integrations.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashgen")
    model.set_attn_implementation("flashgen")          # or switch a loaded model

transformers then runs "flashgen" exactly as it runs "flash_attention_2": its own
flash_attention_forward and _flash_attention_forward (padding masks unpadded to
flash_attn_varlen_func and re-padded, packed sequences from position_ids or cu_seq_lens_q/k,
GQA, sliding windows, softcap, sinks, dropout in training, dynamic and static caches, continuous
batching) and its 2-D padding mask instead of a 4-D one, with flashgen's flash_attn_func,
flash_attn_varlen_func and flash_attn_with_kvcache in place of FlashAttention-2's. Written
against transformers 5.17 and 5.24.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

import flashgen

NAME = "flashgen"
# The implementation whose registrations flashgen's mirror: transformers names it in its
# attention functions ("flash_attention_2", and "paged|flash_attention_2" in releases whose
# continuous batching switches to a "paged|" name) and in its mask functions.
_MIRRORED = "flash_attention_2"
# Models whose attention passes sinks (s_aux=) accept only the flash implementations listed in
# their _compatible_flash_implementations (those that take sinks); any other name containing
# "flash" is swapped for the first of them. Module and class, per model.
_SINK_MODELS = (("gpt_oss", "GptOssPreTrainedModel"),
                ("openai_privacy_filter", "OpenAIPrivacyFilterPreTrainedModel"),
                ("flint", "FlintPreTrainedModel"),
                ("granite_swa", "GraniteSWAPreTrainedModel"),
                ("granitemoe_swa", "GraniteMoeSWAPreTrainedModel"))


def register() -> None:
    """Makes attn_implementation="flashgen" (from_pretrained, from_config,
    set_attn_implementation) run every attention layer on flashgen. Call it once before
    loading; calling it again changes nothing."""
    from transformers import modeling_flash_attention_utils as flash_utils
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    lazy_imports = getattr(flash_utils, "_lazy_imports", None)
    if lazy_imports is None:
        import transformers

        raise RuntimeError(f"flashgen: transformers {transformers.__version__} has no "
                           f"modeling_flash_attention_utils._lazy_imports to serve flashgen's "
                           f"functions through; flashgen's integration is tested with 5.17-5.24")
    for functions in (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS):
        for name in list(functions):
            if name.removeprefix("paged|") == _MIRRORED:
                functions.register(name.replace(_MIRRORED, NAME), functions[name])
    # Every name containing "flash" counts as a flash implementation in transformers: a model
    # preloads its functions by name (lazy_import_flash_attention), and _lazy_imports, the one
    # place that maps a name to functions, knows only FlashAttention 2-4 and Hub kernels. So
    # flashgen's are served from there.
    if not getattr(lazy_imports, "serves_flashgen", False):
        flash_utils._lazy_imports = _serving_flashgen(lazy_imports)
    if "s_aux" in inspect.signature(flashgen.flash_attn_varlen_func).parameters:
        _accept_in_sink_models()


def _serving_flashgen(lazy_imports):
    """transformers' _lazy_imports(implementation, ...), the functions of a flash
    implementation by name, answering flashgen's functions for NAME and paged|NAME."""
    @functools.wraps(lazy_imports)
    def lazy_imports_with_flashgen(implementation, *args, **kwargs):
        if implementation is not None and implementation.removeprefix("paged|") == NAME:
            return _functions()
        return lazy_imports(implementation, *args, **kwargs)

    lazy_imports_with_flashgen.serves_flashgen = True
    return lazy_imports_with_flashgen


def _functions() -> tuple:
    """(flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, pad_input,
    unpad_input) as _lazy_imports returns them; transformers' own padding helpers, which it uses
    for every flash implementation but FlashAttention-2's package."""
    from transformers.modeling_flash_attention_utils import _pad_input, _unpad_input

    return (_taking_transformers_values(flashgen.flash_attn_func),
            _taking_transformers_values(flashgen.flash_attn_varlen_func),
            flashgen.flash_attn_with_kvcache, _pad_input, _unpad_input)


def _taking_transformers_values(function):
    """function taking two values as transformers passes them to FlashAttention-2: sinks
    (s_aux) cast to q's dtype ("FA only accepts half precision"), which flashgen takes in fp32,
    and max_seqlen_q/k as 0-d tensors where it reads them off packed position_ids, which
    flashgen takes as ints (FA2's binding converts them too: a sync). Its signature stays
    function's (inspect follows __wrapped__): transformers passes what that signature takes."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        if kwargs.get("s_aux") is not None:
            kwargs["s_aux"] = kwargs["s_aux"].float()
        for name in ("max_seqlen_q", "max_seqlen_k"):
            if isinstance(kwargs.get(name), torch.Tensor):
                kwargs[name] = int(kwargs[name])
        return function(*args, **kwargs)

    return call


def _accept_in_sink_models() -> None:
    """Adds NAME to the flash implementations each sink model accepts (those this transformers
    has)."""
    for model, class_name in _SINK_MODELS:
        try:
            module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
        except ImportError:
            continue
        model_class = getattr(module, class_name, None)
        accepted = getattr(model_class, "_compatible_flash_implementations", None)
        if accepted is not None and NAME not in accepted:
            model_class._compatible_flash_implementations = [*accepted, NAME]
