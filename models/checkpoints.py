"""Hugging Face checkpoint folders in and out of `transformer_lm`: `from_transformers`,
`to_transformers` (GPT-2, Llama, Mistral, Qwen2).

A folder is transformers' `save_pretrained` layout: `config.json`, the weights as
`model.safetensors` (or shards listed by `model.safetensors.index.json`) and
`generation_config.json`. The weights are read and written with `safetensors`' NumPy API;
the configuration is checked field by field: a field that changes the math and that
`transformer_lm` does not implement raises `ValueError` naming it.

The tensors, Hugging Face's (`Linear` weights `(out, in)`; GPT-2's `Conv1D` `(in, out)`,
its q, k, v fused) -> `transformer_lm`'s (kernels `(in, out)`, the heads split out:
`(d, h, k)`, head-major as transformers' `view(..., h, k)`):

| Llama, Mistral, Qwen2 | GPT-2 | `transformer_lm` |
|---|---|---|
| `model.embed_tokens` | `transformer.wte` | `token_embedding/embeddings` |
| `lm_head` (untied) | `lm_head` (untied) | `token_embedding/reverse_embeddings` (transposed) |
| | `transformer.wpe` | `position_embedding/embeddings` |
| `layers.{i}.input_layernorm` | `h.{i}.ln_1` | `decoder_block_{i}/self_attention_layer_norm` |
| `self_attn.{q,k,v}_proj` (Qwen2: biases) | `attn.c_attn` | `self_attention/{query,key,value}` |
| `self_attn.o_proj` | `attn.c_proj` | `self_attention/attention_output` |
| `post_attention_layernorm` | `ln_2` | `feedforward_layer_norm` |
| `mlp.gate_proj` | | `feedforward_gate_dense` |
| `mlp.up_proj` | `mlp.c_fc` | `feedforward_intermediate_dense` |
| `mlp.down_proj` | `mlp.c_proj` | `feedforward_output_dense` |
| `model.norm` | `transformer.ln_f` | `final_norm` |
"""

import json
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import numpy as np

from .layers import gelu_approximate
from .transformer_lm import transformer_lm

FAMILIES = ("gpt2", "llama", "mistral", "qwen2")
_ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# `from_transformers`' options: what the checkpoint leaves open (the rest it fixes).
OPTIONS = ("padding_id", "implementation", "name", "dropout", "sequence_length")
# Hugging Face's activations (`ACT2FN`) -> ours: GPT-2's "gelu_new" and "gelu_pytorch_tanh"
# are the tanh approximation, "gelu" the exact (erf) GELU, Keras' "gelu".
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": gelu_approximate,
    "gelu_pytorch_tanh": gelu_approximate,
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
# Tensors that are buffers, not weights (older GPT-2 files: the causal mask; rotary tables).
_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
_ROPE_KEYS = (
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)


# ---------------------------------------------------------------------------
# Reading and writing safetensors
# ---------------------------------------------------------------------------


def read_safetensors(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint folder: `model.safetensors`, or the shards of
    `model.safetensors.index.json`. NumPy arrays, bfloat16 widened to float32 (exactly).

    Raises:
        FileNotFoundError: neither file (a `pytorch_model.bin` is not read).
    """
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(folder, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(
            f"A checkpoint folder holds model.safetensors or model.safetensors.index.json "
            f"(safetensors; pytorch_model.bin is not read). Received: {os.fspath(folder)!r} "
            f"with {sorted(os.listdir(folder))}"
        )
    tensors = {}
    for name in files:
        path = os.path.join(folder, name)
        header, start = _header(path)
        with safe_open(path, framework="np") as f:
            for key in f.keys():
                entry = header[key]
                if entry["dtype"] == "BF16":  # NumPy has no bfloat16: its bits, widened
                    tensors[key] = _bfloat16(path, start, entry)
                else:
                    tensors[key] = f.get_tensor(key)
    return tensors


def _header(path):
    """A safetensors file's header (name -> dtype, shape, byte offsets) and where data starts."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)), 8 + size


def _bfloat16(path, start, entry):
    """A bfloat16 tensor as float32: its 16 bits are the high half of a float32's."""
    begin, _ = entry["data_offsets"]
    count = math.prod(entry["shape"])
    bits = np.fromfile(path, dtype="<u2", count=count, offset=start + begin)
    return (bits.astype("uint32") << 16).view("float32").reshape(entry["shape"])


# ---------------------------------------------------------------------------
# The tensors of each family
# ---------------------------------------------------------------------------


class _Tensor(NamedTuple):
    """One Hugging Face tensor and the weights of ours it holds (`"layer/path:attribute"`)."""

    name: str
    weights: tuple[str, ...]
    to_ours: Callable  # their array -> a tuple of arrays, one per weight
    to_theirs: Callable  # a tuple of arrays -> their array


def _same(name, weight):
    return _Tensor(name, (weight,), lambda w: (w,), lambda ws: ws[0])


def _transposed(name, weight):
    return _Tensor(name, (weight,), lambda w: (w.T,), lambda ws: ws[0].T)


def _heads_in(name, weight, d, head_dim):
    """`Linear` `(n * k, d)` <-> our heads' kernel `(d, n, k)`."""
    return _Tensor(
        name,
        (weight,),
        lambda w: (w.T.reshape(d, -1, head_dim),),
        lambda ws: ws[0].reshape(d, -1).T,
    )


def _heads_bias(name, weight, head_dim):
    """A bias `(n * k,)` <-> `(n, k)`."""
    return _Tensor(
        name, (weight,), lambda w: (w.reshape(-1, head_dim),), lambda ws: ws[0].reshape(-1)
    )


def _heads_out(name, weight, d, head_dim):
    """`Linear` `(d, h * k)` <-> our output kernel `(h, k, d)`."""
    return _Tensor(
        name,
        (weight,),
        lambda w: (w.T.reshape(-1, head_dim, d),),
        lambda ws: ws[0].reshape(-1, d).T,
    )


def _llama_tensors(config: dict) -> list[_Tensor]:
    """The Llama family's tensors (Mistral's and Qwen2's: the same names; Qwen2 adds q, k, v
    biases)."""
    d, head_dim = config["d_model"], config["d_model"] // config["num_heads"]
    tensors = [_same("model.embed_tokens.weight", "token_embedding:embeddings")]
    if not config["tie_weights"]:
        tensors.append(_transposed("lm_head.weight", "token_embedding:reverse_embeddings"))
    for i in range(config["num_layers"]):
        theirs, ours = f"model.layers.{i}.", f"decoder_block_{i}/"
        for proj, dense in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            attention = f"{ours}self_attention/{dense}"
            tensors.append(
                _heads_in(f"{theirs}self_attn.{proj}.weight", f"{attention}:kernel", d, head_dim)
            )
            if config["qkv_bias"]:
                tensors.append(
                    _heads_bias(f"{theirs}self_attn.{proj}.bias", f"{attention}:bias", head_dim)
                )
        tensors += [
            _heads_out(
                f"{theirs}self_attn.o_proj.weight",
                f"{ours}self_attention/attention_output:kernel",
                d,
                head_dim,
            ),
            _transposed(f"{theirs}mlp.gate_proj.weight", f"{ours}feedforward_gate_dense:kernel"),
            _transposed(
                f"{theirs}mlp.up_proj.weight", f"{ours}feedforward_intermediate_dense:kernel"
            ),
            _transposed(f"{theirs}mlp.down_proj.weight", f"{ours}feedforward_output_dense:kernel"),
            _same(f"{theirs}input_layernorm.weight", f"{ours}self_attention_layer_norm:scale"),
            _same(
                f"{theirs}post_attention_layernorm.weight", f"{ours}feedforward_layer_norm:scale"
            ),
        ]
    return tensors + [_same("model.norm.weight", "final_norm:scale")]


def _gpt2_tensors(config: dict) -> list[_Tensor]:
    """GPT-2's tensors: `Conv1D` weights are `(in, out)` already; `c_attn` is q, k, v side
    by side."""
    d, head_dim = config["d_model"], config["d_model"] // config["num_heads"]
    rows = config["sequence_length"]
    tensors = [
        _same("transformer.wte.weight", "token_embedding:embeddings"),
        _Tensor(  # theirs may have more rows than `sequence_length` asks for
            "transformer.wpe.weight",
            ("position_embedding:position_embeddings",),
            lambda w: (w[:rows],),
            lambda ws: ws[0],
        ),
    ]
    if not config["tie_weights"]:
        tensors.append(_transposed("lm_head.weight", "token_embedding:reverse_embeddings"))
    for i in range(config["num_layers"]):
        theirs, ours = f"transformer.h.{i}.", f"decoder_block_{i}/"
        qkv = tuple(f"{ours}self_attention/{n}" for n in ("query", "key", "value"))
        tensors += [
            _same(f"{theirs}ln_1.weight", f"{ours}self_attention_layer_norm:gamma"),
            _same(f"{theirs}ln_1.bias", f"{ours}self_attention_layer_norm:beta"),
            _Tensor(
                f"{theirs}attn.c_attn.weight",
                tuple(f"{p}:kernel" for p in qkv),
                lambda w: tuple(k.reshape(d, -1, head_dim) for k in np.split(w, 3, axis=1)),
                lambda ws: np.concatenate([k.reshape(d, -1) for k in ws], axis=1),
            ),
            _Tensor(
                f"{theirs}attn.c_attn.bias",
                tuple(f"{p}:bias" for p in qkv),
                lambda b: tuple(v.reshape(-1, head_dim) for v in np.split(b, 3)),
                lambda ws: np.concatenate([v.reshape(-1) for v in ws]),
            ),
            _Tensor(
                f"{theirs}attn.c_proj.weight",
                (f"{ours}self_attention/attention_output:kernel",),
                lambda w: (w.reshape(-1, head_dim, d),),
                lambda ws: ws[0].reshape(-1, d),
            ),
            _same(f"{theirs}attn.c_proj.bias", f"{ours}self_attention/attention_output:bias"),
            _same(f"{theirs}ln_2.weight", f"{ours}feedforward_layer_norm:gamma"),
            _same(f"{theirs}ln_2.bias", f"{ours}feedforward_layer_norm:beta"),
            _same(f"{theirs}mlp.c_fc.weight", f"{ours}feedforward_intermediate_dense:kernel"),
            _same(f"{theirs}mlp.c_fc.bias", f"{ours}feedforward_intermediate_dense:bias"),
            _same(f"{theirs}mlp.c_proj.weight", f"{ours}feedforward_output_dense:kernel"),
            _same(f"{theirs}mlp.c_proj.bias", f"{ours}feedforward_output_dense:bias"),
        ]
    return tensors + [
        _same("transformer.ln_f.weight", "final_norm:gamma"),
        _same("transformer.ln_f.bias", "final_norm:beta"),
    ]


def _tensors(family: str, config: dict) -> list[_Tensor]:
    return _gpt2_tensors(config) if family == "gpt2" else _llama_tensors(config)


# ---------------------------------------------------------------------------
# In: config.json -> transformer_lm arguments
# ---------------------------------------------------------------------------


def _unsupported(family, field, value, supported):
    return ValueError(
        f"The {family} checkpoint's config field `{field}` = {value!r} is not supported by "
        f"transformer_lm (supported: {supported}): it changes the model's math."
    )


def _require(config, family, field, default, supported):
    value = config.get(field, default)
    if value not in supported:
        raise _unsupported(family, field, value, supported)
    return value


def _activation(config, family, field, default):
    name = config.get(field, default)
    if name not in _ACTIVATIONS:
        raise _unsupported(family, field, name, tuple(_ACTIVATIONS))
    return _ACTIVATIONS[name]


def _rope(config, family):
    """`(rope_theta, transformer_lm's rope_scaling or None)` from transformers 5's
    `rope_parameters` or transformers 4's `rope_theta` and `rope_scaling`."""
    parameters = config.get("rope_parameters")
    if parameters is None:
        parameters = dict(config.get("rope_scaling") or {})
        parameters.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    unknown = sorted(set(parameters) - set(_ROPE_KEYS))
    if unknown:
        raise _unsupported(family, f"rope_parameters[{unknown[0]!r}]", parameters[unknown[0]],
                           "rope_type default, linear, llama3")  # fmt: skip
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    theta = float(parameters.get("rope_theta", 10000.0))
    if rope_type == "default":
        return theta, None
    if rope_type == "linear":
        return theta, {"rope_type": "linear", "scaling_factor": float(parameters["factor"])}
    if rope_type == "llama3":
        return theta, {
            "rope_type": "llama3",
            "scaling_factor": float(parameters["factor"]),
            "low_freq_factor": float(parameters["low_freq_factor"]),
            "high_freq_factor": float(parameters["high_freq_factor"]),
            "original_max_position_embeddings": int(parameters["original_max_position_embeddings"]),
        }
    raise _unsupported(family, "rope_type", rope_type, ("default", "linear", "llama3"))


def _sliding_window(config, family):
    """Mistral's `sliding_window` (every layer), Qwen2's with `use_sliding_window`; a mix of
    windowed and full layers (`layer_types`) has no single `sliding_window`."""
    kinds = set(config.get("layer_types") or ())
    if len(kinds) > 1:
        raise _unsupported(family, "layer_types", sorted(kinds), "one kind for every layer")
    if family == "llama":
        if kinds - {"full_attention"}:
            raise _unsupported(family, "layer_types", sorted(kinds), ["full_attention"])
        return None
    if family == "qwen2" and not config.get("use_sliding_window", False):
        return None
    if family == "qwen2" and kinds != {"sliding_attention"}:
        raise _unsupported(
            family, "max_window_layers", config.get("max_window_layers"),
            "use_sliding_window with every layer's `layer_types` 'sliding_attention'",
        )  # fmt: skip
    window = config.get("sliding_window")
    if kinds == {"full_attention"} or window is None:
        return None
    return int(window)


def _llama_options(config: dict, family: str) -> dict:
    d, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // heads
    if head_dim * heads != d:
        raise _unsupported(family, "head_dim", head_dim, f"hidden_size / num_attention_heads = "
                           f"{d / heads:g}")  # fmt: skip
    if family == "llama":
        _require(config, family, "attention_bias", False, (False,))
        _require(config, family, "mlp_bias", False, (False,))
    _require(config, family, "partial_rotary_factor", 1.0, (1.0,))
    theta, rope_scaling = _rope(config, family)
    tie = config.get("tie_word_embeddings", False)
    return dict(
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        d_model=d,
        intermediate_dim=config["intermediate_size"],
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        position="rotary",
        sliding_window=_sliding_window(config, family),
        dropout=0.0,
        activation=_activation(config, family, "hidden_act", "silu"),
        layer_norm_epsilon=config.get("rms_norm_eps", 1e-6),
        normalize_first=True,
        tie_weights=bool(tie),
        max_wavelength=theta,
        normalization="rms_norm",
        feedforward="gated",
        use_bias=False,
        qkv_bias=family == "qwen2",
        rope_scaling=rope_scaling,
    )


def _gpt2_options(config: dict) -> dict:
    family = "gpt2"
    _require(config, family, "scale_attn_weights", True, (True,))
    _require(config, family, "scale_attn_by_inverse_layer_idx", False, (False,))
    _require(config, family, "add_cross_attention", False, (False,))
    d = config["n_embd"]
    return dict(
        vocab_size=config["vocab_size"],
        num_layers=config["n_layer"],
        num_heads=config["n_head"],
        d_model=d,
        intermediate_dim=config.get("n_inner") or 4 * d,
        position="learned",
        sequence_length=config["n_positions"],
        dropout=0.0,
        activation=_activation(config, family, "activation_function", "gelu_new"),
        layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
        normalize_first=True,
        tie_weights=bool(config.get("tie_word_embeddings", True)),
    )


def _read_config(folder) -> tuple[str, dict]:
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(
            f"from_transformers reads the model types {FAMILIES}. Received: model_type="
            f"{family!r} (architectures {config.get('architectures')})"
        )
    return family, config


def from_transformers(path: str | os.PathLike, **options: Any) -> keras.Model:
    """A `transformer_lm` with a Hugging Face checkpoint's configuration and weights.

    Reads a folder as `save_pretrained` writes it (`config.json`, `model.safetensors` or a
    sharded `model.safetensors.index.json`; float32, float16 or bfloat16 weights, cast to
    the variables' dtype: the Keras dtype policy) of the GPT-2 (`gpt2`), Llama (`llama`:
    rope scaling none, linear or llama3), Mistral (`mistral`, its sliding window) and Qwen2
    (`qwen2`) families. The model computes the checkpoint's logits (tested against
    transformers' own to 1e-4 in float32, and the same greedy tokens as its `generate`).

    **Token ids are the checkpoint's own**: id 0 is a real token. The model is built with
    `padding_id=-1`: pad prompts and batches with -1 (the model's padding mask and
    positions, and `keras_attn.models.generate`, read -1 as padding; every id of the
    vocabulary can be generated). Positions count real tokens (`TokenPositions`): with no
    padding they are Hugging Face's `0, 1, ...`; a left-padded row gets the positions of
    the row unpadded, as transformers' `generate` gives it with an attention mask.

    Every config field that changes the math is read or checked: an unsupported
    `model_type`, `rope_type` (yarn, dynamic, ...), `attention_bias` or `mlp_bias` on
    Llama, a `partial_rotary_factor`, a `head_dim` other than `hidden_size /
    num_attention_heads`, an activation without a Keras equivalent, layers that mix
    windowed and full attention, a tensor that the configuration does not expect (or
    misses), or an `lm_head` that differs from the embeddings of a tied model raise
    `ValueError` naming it. Dropout rates (training only) are not read: `dropout=0.0`.

    Args:
        path: the checkpoint folder.
        **options: what the checkpoint leaves open: `padding_id` (a negative int, default
            -1), `implementation` (the attention kernel), `name`, `dropout` (for
            fine-tuning), `sequence_length` (GPT-2: a position table shorter than
            `n_positions`).

    Returns:
        A `keras.Model` from `transformer_lm`: int32 tokens `(B, T)` -> logits `(B, T, V)`.

    Raises:
        ValueError: see above; an option outside `OPTIONS`.
        FileNotFoundError: no safetensors weights in the folder.

    Example (a folder written by `transformers`' `save_pretrained`, or by
    `to_transformers`):

    >>> from keras_attn.models import from_transformers  # doctest: +SKIP
    >>> model = from_transformers("TinyLlama-1.1B")  # doctest: +SKIP
    >>> tokens = generate(model, [[1, 415, 5566, 349]], max_length=8)  # doctest: +SKIP
    """
    folder = os.fspath(path)
    family, config = _read_config(folder)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"from_transformers takes the options {OPTIONS} (the checkpoint fixes the rest). "
            f"Received: {unknown}"
        )
    arguments = _gpt2_options(config) if family == "gpt2" else _llama_options(config, family)
    arguments.update(padding_id=-1, name=f"{family}_lm")
    arguments.update(options)
    if family == "gpt2" and arguments["sequence_length"] > config["n_positions"]:
        raise ValueError(
            f"`sequence_length` must be at most the checkpoint's n_positions "
            f"({config['n_positions']}). Received: sequence_length={arguments['sequence_length']}"
        )
    model = transformer_lm(**arguments)
    tensors = _canonical(family, read_safetensors(folder))
    expected = _tensors(family, _summary(arguments))
    _check_names(family, config, tensors, expected)
    layers = {layer.path: layer for layer in model._flatten_layers(include_self=False)}
    for tensor in expected:
        values = tensor.to_ours(tensors[tensor.name])
        for weight, value in zip(tensor.weights, values, strict=True):
            variable = getattr(layers[weight.split(":")[0]], weight.split(":")[1])
            if tuple(variable.shape) != value.shape:
                raise ValueError(
                    f"The tensor {tensor.name} of shape {tensors[tensor.name].shape} does not "
                    f"fit {variable.path} {tuple(variable.shape)}: config.json and the weights "
                    "disagree."
                )
            variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
    return model


def _summary(arguments):
    """The `transformer_lm` arguments the tensor lists read."""
    summary = dict(arguments)
    summary.setdefault("qkv_bias", True)
    summary.setdefault("sequence_length", 1024)
    return summary


def _canonical(family, tensors):
    """GPT-2's names with their `transformer.` prefix (older files have none)."""
    if family != "gpt2":
        return tensors
    return {
        name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}": value
        for name, value in tensors.items()
    }


def _check_names(family, config, tensors, expected):
    names = {t.name for t in expected}
    missing = sorted(names - set(tensors))
    extra = sorted(n for n in set(tensors) - names if not n.endswith(_BUFFERS))
    if "lm_head.weight" in extra:  # a tied model's, written anyway
        embeddings = tensors["model.embed_tokens.weight" if family != "gpt2" else
                             "transformer.wte.weight"]  # fmt: skip
        if not np.array_equal(tensors["lm_head.weight"], embeddings):
            raise _unsupported(
                family, "tie_word_embeddings", config.get("tie_word_embeddings"),
                "an lm_head.weight equal to the embeddings (this one differs)",
            )  # fmt: skip
        extra.remove("lm_head.weight")
    if missing or extra:
        raise ValueError(
            f"The {family} checkpoint's tensors do not match its config.json: missing "
            f"{missing[:5]}, unexpected {extra[:5]}."
        )


# ---------------------------------------------------------------------------
# Out: transformer_lm -> config.json, model.safetensors, generation_config.json
# ---------------------------------------------------------------------------


def _no_equivalent(what, value):
    return ValueError(
        f"to_transformers: the model's {what} = {value!r} has no Hugging Face equivalent "
        "(GPT-2: learned positions, LayerNorm, dense GELU/ReLU feed-forward with biases; "
        "Llama/Mistral/Qwen2: rotary positions, RMS norm, gated feed-forward without biases)."
    )


def _describe(model) -> tuple[str, dict]:
    """The family a `transformer_lm` exports as, and its `transformer_lm` arguments."""
    names = {layer.name for layer in model.layers}
    if not {"token_embedding", "decoder_block_0"} <= names or "encoder_embedding" in names:
        raise ValueError(
            f"to_transformers writes models built by transformer_lm. Received: {model.name!r}"
        )
    blocks, i = [], 0
    while f"decoder_block_{i}" in names:
        blocks.append(model.get_layer(f"decoder_block_{i}"))
        i += 1
    configs = [_unnamed(b.get_config()) for b in blocks]
    if any(c != configs[0] for c in configs):
        raise _no_equivalent("blocks", "configured differently")
    block, config = blocks[0], configs[0]
    for layer in model._flatten_layers(include_self=False):
        if getattr(layer, "quantization_mode", None) is not None:
            raise _no_equivalent(f"layer {layer.path!r} quantization", layer.quantization_mode)
    embedding = model.get_layer("token_embedding")
    if embedding.logit_soft_cap is not None:
        raise _no_equivalent("logit_soft_cap", embedding.logit_soft_cap)
    position = model.get_layer("position_embedding") if "position_embedding" in names else None
    rotary = config["rotary_embedding"]  # None, or the serialized RotaryEmbedding
    if position is not None and type(position).__name__ != "PositionEmbedding":
        raise _no_equivalent("position", "sinusoidal")
    if config["position_bias"] is not None:
        raise _no_equivalent("position", "alibi (a position bias)")
    if position is None and rotary is None:
        raise _no_equivalent("position", None)
    if not config["normalize_first"]:
        raise _no_equivalent("normalize_first", False)
    d = embedding.output_dim
    if config["key_dim"] not in (None, d // config["num_heads"]):
        raise _no_equivalent("key_dim", config["key_dim"])
    activation = keras.activations.get(block.activation).__name__
    summary = dict(
        vocab_size=embedding.input_dim,
        num_layers=len(blocks),
        num_heads=config["num_heads"],
        d_model=d,
        intermediate_dim=config["intermediate_dim"],
        num_key_value_heads=config["num_key_value_heads"] or config["num_heads"],
        sliding_window=config["sliding_window"],
        dropout=config["dropout"],
        activation=activation,
        layer_norm_epsilon=config["layer_norm_epsilon"],
        tie_weights=embedding.tie_weights,
        qkv_bias=config["use_bias"] if config["qkv_bias"] is None else config["qkv_bias"],
        padding_id=(model.get_layer("token_padding").padding_id if "token_padding" in names else 0),
    )
    if position is not None:  # GPT-2
        expected = dict(normalization="layer_norm", feedforward="dense", use_bias=True)
        for key, value in expected.items():
            if config[key] != value:
                raise _no_equivalent(f"{key} with learned positions (GPT-2)", config[key])
        if not summary["qkv_bias"]:
            raise _no_equivalent("qkv_bias with learned positions (GPT-2)", False)
        if summary["num_key_value_heads"] != summary["num_heads"]:
            raise _no_equivalent("num_key_value_heads (GPT-2)", summary["num_key_value_heads"])
        if summary["sliding_window"] is not None:
            raise _no_equivalent("sliding_window (GPT-2)", summary["sliding_window"])
        if activation not in ("gelu", "gelu_approximate", "relu"):
            raise _no_equivalent("activation (GPT-2)", activation)
        summary["sequence_length"] = position.sequence_length
        return "gpt2", summary
    expected = dict(normalization="rms_norm", feedforward="gated", use_bias=False)
    for key, value in expected.items():
        if config[key] != value:
            raise _no_equivalent(f"{key} with rotary positions (Llama)", config[key])
    rotary = rotary["config"]
    if rotary["layout"] != "half":
        raise _no_equivalent("rotary layout", rotary["layout"])
    if activation not in ("silu", "gelu", "gelu_approximate"):
        raise _no_equivalent("activation (Llama)", activation)
    summary["rope"] = rotary
    if summary["qkv_bias"]:
        if summary["sliding_window"] is not None:
            raise _no_equivalent("sliding_window with q/k/v biases (Qwen2)",
                                 summary["sliding_window"])  # fmt: skip
        return "qwen2", summary
    return ("mistral" if summary["sliding_window"] is not None else "llama"), summary


def _unnamed(config):
    """A block's config without the names of it and its sublayers (to compare blocks)."""
    if isinstance(config, dict):
        return {k: _unnamed(v) for k, v in config.items() if k != "name"}
    return config


def _rope_parameters(rope):
    """`RotaryEmbedding`'s config -> transformers' `rope_parameters`."""
    theta = float(rope["max_wavelength"])
    if rope["rope_type"] == "llama3":
        return {
            "rope_type": "llama3",
            "rope_theta": theta,
            "factor": float(rope["scaling_factor"]),
            "low_freq_factor": float(rope["low_freq_factor"]),
            "high_freq_factor": float(rope["high_freq_factor"]),
            "original_max_position_embeddings": int(rope["original_max_position_embeddings"]),
        }
    if rope["scaling_factor"] != 1.0:
        return {"rope_type": "linear", "rope_theta": theta, "factor": float(rope["scaling_factor"])}
    return {"rope_type": "default", "rope_theta": theta}


def _hf_config(family, summary, dtype, max_position_embeddings, ids):
    d, heads = summary["d_model"], summary["num_heads"]
    common = dict(
        architectures=[_ARCHITECTURES[family]],
        model_type=family,
        vocab_size=summary["vocab_size"],
        tie_word_embeddings=summary["tie_weights"],
        dtype=dtype,
        **ids,
    )
    if family == "gpt2":
        activation = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu"}
        return dict(
            common,
            n_embd=d,
            n_layer=summary["num_layers"],
            n_head=heads,
            n_inner=summary["intermediate_dim"],
            n_positions=summary["sequence_length"],
            activation_function=activation[summary["activation"]],
            layer_norm_epsilon=summary["layer_norm_epsilon"],
            resid_pdrop=summary["dropout"],
            embd_pdrop=summary["dropout"],
            attn_pdrop=summary["dropout"],
            scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=False,
            reorder_and_upcast_attn=False,
        )
    rope = _rope_parameters(summary["rope"])
    activation = {"silu": "silu", "gelu": "gelu", "gelu_approximate": "gelu_pytorch_tanh"}
    config = dict(
        common,
        hidden_size=d,
        intermediate_size=summary["intermediate_dim"],
        num_hidden_layers=summary["num_layers"],
        num_attention_heads=heads,
        num_key_value_heads=summary["num_key_value_heads"],
        head_dim=d // heads,
        hidden_act=activation[summary["activation"]],
        rms_norm_eps=summary["layer_norm_epsilon"],
        max_position_embeddings=max_position_embeddings,
        attention_dropout=summary["dropout"],
        rope_parameters=rope,
        # transformers 4 (and the engines that read its names): the same rope
        rope_theta=rope["rope_theta"],
        rope_scaling=(
            None
            if rope["rope_type"] == "default"
            else {k: v for k, v in rope.items() if k != "rope_theta"}
        ),
    )
    if family == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    elif family == "mistral":
        config.update(sliding_window=summary["sliding_window"])
    else:
        config.update(use_sliding_window=False, sliding_window=None)
    return config


def to_transformers(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    start_id: int | None = None,
    end_id: int | None = None,
    max_position_embeddings: int | None = None,
) -> None:
    """Writes a `transformer_lm` as a Hugging Face checkpoint folder.

    `config.json`, `model.safetensors` and `generation_config.json`, which
    `transformers.AutoModelForCausalLM.from_pretrained(path)` loads to the same logits
    (tested), as do the engines that read this layout (vLLM, SGLang, TGI: not run here).
    The family follows the model's options:

    - learned positions, LayerNorm, a dense feed-forward with biases, tied or not: GPT-2
      (`activation` `"gelu"` -> `"gelu"`, the exact GELU; `gelu_approximate` ->
      `"gelu_new"`, the tanh approximation; `"relu"`);
    - rotary positions, RMS norm, a gated feed-forward without biases: Llama; with a
      `sliding_window`: Mistral; with q/k/v biases: Qwen2.

    Anything else raises `ValueError` naming it: sinusoidal or ALiBi positions, post-norm
    blocks, a quantized model (`quantize`), a logit soft cap, mixed options (RMS norm with
    learned positions, ...), a window with q/k/v biases. A model with LoRA enabled writes
    its merged kernels (`W + A B`).

    Token ids are written as they are. The zoo's own models (`padding_id=0`) have no token
    0: `pad_token_id` is 0, and with unpadded inputs Hugging Face's positions
    `0, 1, ...` are ours (ours count real tokens only, so a padded row's positions are
    those of the row unpadded; transformers' `generate` gives a left-padded row the same
    with its attention mask). A model built with a negative `padding_id` (an imported
    checkpoint) has no `pad_token_id`.

    A `TextLanguageModel` (what `keras-attn train transformer-lm` saves) also writes
    `tokenizer.json` and `tokenizer_config.json` (`_write_tokenizer`: the vocabulary as a
    word-level model with our splitting) and, in `generation_config.json`, its `max_length`
    and the ids it never generates (padding and `suppress_tokens`), so that
    `transformers.pipeline("text-generation", model=path)` continues a prompt with the words
    of `predict_text` (greedy; tested).

    Weights are written in the variables' dtype (float32 or float16; bfloat16 ones as
    float32, exactly).

    Args:
        model: a model built by `transformer_lm` (or `from_transformers`), or a
            `keras_attn.models.text.TextLanguageModel`.
        path: the folder to write (created; existing files of these names replaced).
        start_id, end_id: the `bos_token_id` and `eos_token_id` to write, if any.
        max_position_embeddings: the longest sequence the engines allow, written for
            rotary models (default 2048; the learned table's length for GPT-2).

    Raises:
        ValueError: a model or option without a Hugging Face equivalent, as above.
    """
    from safetensors.numpy import save_file

    text_model = None
    if hasattr(model, "language_model") and hasattr(model, "lookup"):  # a TextLanguageModel
        text_model, model = model, model.language_model
        vocabulary = text_model.lookup.get_vocabulary()
        start_id = vocabulary.index(text_model.start_token) if start_id is None else start_id
        end_id = text_model.end_id if end_id is None else end_id
    family, summary = _describe(model)
    layers = {layer.path: layer for layer in model._flatten_layers(include_self=False)}
    tensors = {}
    for tensor in _tensors(family, summary):
        values = []
        for weight in tensor.weights:
            layer_path, attribute = weight.split(":")
            value = keras.ops.convert_to_numpy(getattr(layers[layer_path], attribute))
            if value.dtype not in (np.float32, np.float16):  # bfloat16: widened, exactly
                value = value.astype("float32")
            values.append(value)
        tensors[tensor.name] = np.ascontiguousarray(tensor.to_theirs(tuple(values)))
    dtype = str(next(iter(tensors.values())).dtype)
    ids = dict(
        bos_token_id=start_id,
        eos_token_id=end_id,
        pad_token_id=0 if summary["padding_id"] == 0 else None,
    )
    if family == "gpt2":
        max_position_embeddings = summary["sequence_length"]
    config = _hf_config(family, summary, dtype, max_position_embeddings or 2048, ids)
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    generation = dict({k: v for k, v in ids.items() if v is not None}, do_sample=False)
    if text_model is not None:
        _write_tokenizer(text_model, path)
        generation.update(
            max_new_tokens=text_model.max_length,
            suppress_tokens=sorted({summary["padding_id"], *text_model.suppress_ids} - {-1}),
        )
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2, sort_keys=True)


# A punctuation mark (`keras_attn.models.text.language_model.PUNCTUATION`, any whitespace
# in place of the ASCII space it sees after `normalize_spaces`): a word of its own.
_PUNCTUATION = r"[^\p{L}\p{N}\p{M}\s'-]\p{M}*"
_PAD = "[PAD]"  # the name of id 0 (padding, the empty string in our vocabulary)


def _write_tokenizer(text_model, path):
    """`tokenizer.json` and `tokenizer_config.json` of a `TextLanguageModel`'s vocabulary:
    the `tokenizers` library's word-level model, lowercased, punctuation split off, split at
    whitespace, the start token prepended; id 0 (our padding) is the pad token `[PAD]`."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

    vocabulary = text_model.lookup.get_vocabulary()
    words = [_PAD, *vocabulary[1:]]
    if len(set(words)) != len(words):
        raise ValueError(
            f"to_transformers names id 0 (padding) {_PAD!r}: the vocabulary holds it already."
        )
    unknown = vocabulary[1]  # the OOV token, `[UNK]`
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=unknown))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PUNCTUATION), behavior="isolated"),
            pre_tokenizers.WhitespaceSplit(),
        ]
    )
    start, end = text_model.start_token, text_model.end_token
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{start} $A", special_tokens=[(start, words.index(start))]
    )
    tokenizer.add_special_tokens([_PAD, unknown, start, end])
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    config = dict(
        tokenizer_class="PreTrainedTokenizerFast",
        bos_token=start,
        eos_token=end,
        unk_token=unknown,
        pad_token=_PAD,
        clean_up_tokenization_spaces=False,  # "good ." stays as our words join
        model_max_length=text_model.prompt_length + 1,
        truncation_side="left",  # as `prompt_ids` keeps a prompt's last words
    )
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
