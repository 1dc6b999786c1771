"""The differential checks over every public layer (tests/layer_table.py), and what they catch.

`test_paths_agree` runs each case of the table through `testing.assert_paths_agree`:
every variant (the dense, fused and chunked kernels of `MultiHeadAttention`), eager
and compiled with XLA, with zeros, huge values, +-inf and NaN at the padded steps,
against one float64 reference on clean inputs, outputs and gradients. The quick run
checks every layer and variant eagerly in float32 and mixed_float16, and compiled with XLA
in float32 (`XLA_POLICIES`; with XLA in the other policies too, and an outputs-only call
that the gradient checks repeat, the file with its slow tests took 255 s alone on 2 cores
instead of 162 s); `mixed_bfloat16` runs eagerly for
`MultiHeadAttention` and the two blocks, on their cases of the longest sequences, in the slow
run (`test_paths_agree_in_bfloat16`, the same checks; CI runs both). The tests of one case
and variant follow each other and share their compilations; each defect the checks find in
the library is a strict xfail (`LIBRARY_DEFECTS`).

`test_cached_decoding_agrees` runs `testing.assert_cached_decoding_agrees` (a padded
prefill, then one token at a time, eager and XLA, against the full causal pass) on the
layers with a cache. Broken layers at the end show each check raising on its defect.
"""

import functools
import re

import keras
import numpy as np
import pytest
from layer_table import (
    DECODING_MASK,
    DECODING_SEQUENCE,
    ENCODER_MASK,
    ENCODER_SEQUENCE,
    IMPLEMENTATIONS,
    QUERY_MASK,
    TABLE,
    VALUE_MASKS,
    WIDTH,
    with_numpy_weights,
)

import keras_attn as ka
from keras_attn import testing

# The layers whose paths are checked in mixed_bfloat16 too (slow run).
FULL_MATRIX = {"MultiHeadAttention", "TransformerEncoder", "TransformerDecoder"}
QUICK_POLICIES = ("float32", "mixed_float16")
# The policies whose paths run compiled with XLA too (the others eagerly only).
XLA_POLICIES = ("float32",)
SLOW_POLICIES = tuple(p for p in testing.differential.POLICIES if p not in QUICK_POLICIES)
# In CI on TensorFlow and torch (`jax_slow`: JAX compiles each of its many eager calls).
pytestmark = [
    pytest.mark.filterwarnings("ignore:You are using a softmax over axis -1"),
    pytest.mark.jax_slow,
]


def variant_name(overrides):
    return "-".join(str(v) for v in overrides.values()) or "default"


@functools.cache
def layer_for(name, case_name):
    """The table's layer, built on the case, with NumPy weights (the same on every backend)."""
    case = TABLE[name].cases[case_name]
    layer = TABLE[name].make()
    tensors = {n: keras.ops.convert_to_tensor(v) for n, v in case.inputs.items()}
    layer(**tensors, **case.call_kwargs)
    return with_numpy_weights(layer)


def check(name, case_name, variants, contents, gradients, policies=QUICK_POLICIES):
    entry = TABLE[name]
    case = entry.cases[case_name]
    for xla in (True, False):  # the policies compiled with XLA too, then the eager-only ones
        chosen = [p for p in policies if (p in XLA_POLICIES) == xla]
        if not chosen:
            continue
        testing.assert_paths_agree(
            layer_for(name, case_name),
            case.inputs,
            case.padding,
            variants=variants,
            reference=entry.reference,
            policies=chosen,
            contents=contents,
            gradients=gradients,
            output_mask=case.output_mask,
            zero_rows=case.zero_rows,
            call_kwargs=case.call_kwargs,
            jit_compile=None if xla else (False,),
        )


# ---------------------------------------------------------------------------
# Every layer, every path
# ---------------------------------------------------------------------------


def test_the_table_covers_every_public_layer():
    public = {getattr(ka, n) for n in ka.__all__}
    layers = {c for c in public if isinstance(c, type) and issubclass(c, keras.layers.Layer)}
    assert {c.__name__ for c in layers} == set(TABLE)
    assert ka.KVCache in public and ka.KVCache not in layers  # a NamedTuple, not a layer
    for name, entry in TABLE.items():
        assert type(entry.make()) is getattr(ka, name)
        assert entry.cases and entry.kit


# Per case and variant: "outputs" checks the outputs and the gradients with the finite contents
# (zeros, huge); "inf-nan" the outputs and gradients with inf and NaN. Huge values get a test of
# their own ("huge") where they are a known defect, so that its xfail stays narrow (the
# "outputs" test then checks the outputs alone with huge values).
CONTENTS = ("zeros", "huge", "inf", "nan")
# The defects the checks find in the library as it is, by test id (`layer-case-variant-kind`,
# a regular expression matched from the start): strict xfails.
LIBRARY_DEFECTS = {}


def defect(test_id):
    return next((r for p, r in LIBRARY_DEFECTS.items() if re.match(p, test_id)), None)


def params(names=tuple(TABLE), cases=None):
    """One case and variant after the other, so that their tests share the compilations;
    `cases(case_name)`, if given, picks the cases."""
    for name in names:
        entry = TABLE[name]
        for case_name, case in entry.cases.items():
            if cases is not None and not cases(case_name):
                continue
            for overrides in entry.variants:
                base = f"{name}-{case_name}-{variant_name(overrides)}"
                split = defect(f"{base}-huge") and not defect(f"{base}-outputs")
                kinds = {"outputs": ("zeros",) if split else ("zeros", "huge")}
                kinds.update({"huge": ("huge",)} if split else {})
                kinds.update({"inf-nan": ("inf", "nan")} if case.padding else {})
                for kind, contents in kinds.items():
                    reason = defect(f"{base}-{kind}")
                    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                    values = (name, case_name, overrides, kind, contents)
                    yield pytest.param(*values, id=f"{base}-{kind}", marks=marks)


@pytest.mark.parametrize("name, case, overrides, kind, contents", list(params()))
def test_paths_agree(name, case, overrides, kind, contents):
    if kind == "outputs" and "huge" not in contents:  # huge values' gradients: a defect
        check(name, case, [overrides], ("huge",), gradients=False)
    check(name, case, [overrides], contents, gradients=True)


def _longest(case_name):
    """The cases with keys on both sides of the padding: `Tv=5`, `S=5`, `T=5`, causal (the empty
    and one-key edge cases, `Tv=0`, `Tv=1`, run in the quick run's two policies)."""
    return not case_name.endswith(("=0", "=1"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, case, overrides, kind, contents",
    list(params([n for n in TABLE if n in FULL_MATRIX], cases=_longest)),
)
def test_paths_agree_in_bfloat16(name, case, overrides, kind, contents):
    """`test_paths_agree` in the policies the quick run leaves out (mixed_bfloat16), on the
    cases of the longest sequences."""
    if kind == "outputs" and "huge" not in contents:  # huge values' gradients: a defect
        check(name, case, [overrides], ("huge",), gradients=False, policies=SLOW_POLICIES)
    check(name, case, [overrides], contents, gradients=True, policies=SLOW_POLICIES)


# ---------------------------------------------------------------------------
# Cached decoding
# ---------------------------------------------------------------------------

# Every run in float32; one per layer in mixed_float16 too.
DECODING = [(n, run, "float32") for n, entry in TABLE.items() for run in entry.decoding]
DECODING += [
    (n, run, "mixed_float16") for n, run, _ in DECODING if run in ("plain", "cross-attention")
]


@pytest.mark.parametrize("name, run, policy", DECODING, ids=["-".join(d) for d in DECODING])
def test_cached_decoding_agrees(name, run, policy):
    decoding = TABLE[name].decoding[run]
    encoder = {"encoder_sequence": ENCODER_SEQUENCE, "encoder_padding_mask": ENCODER_MASK}
    testing.assert_cached_decoding_agrees(
        TABLE[name].make(policy, **decoding.overrides),
        DECODING_SEQUENCE,
        DECODING_MASK,
        contents=CONTENTS,
        **(encoder if decoding.encoder else {}),
    )


# ---------------------------------------------------------------------------
# Broken layers: each check raises on the defect it is there to catch
# ---------------------------------------------------------------------------

# Every example sees a real key: value padding left, right and inside.
QUERY = np.random.default_rng(1).normal(size=(3, 4, WIDTH)).astype("float32")
VALUE = np.random.default_rng(2).normal(size=(3, 5, WIDTH)).astype("float32")
FEED = {"query": QUERY, "value": VALUE, "value_mask": VALUE_MASKS[5][:3]}


class AddsAMaskBias(keras.layers.Layer):
    """Adds -1e30 to the masked scores instead of replacing them (the fused kernel's old bug)."""

    def call(self, query, value, value_mask=None):
        scores = keras.ops.matmul(query, keras.ops.swapaxes(value, 1, 2))  # (B, Tq, Tv)
        bias = keras.ops.where(value_mask[:, None, :], 0.0, -1e30)
        weights = keras.ops.softmax(scores + keras.ops.cast(bias, scores.dtype), axis=-1)
        return keras.ops.matmul(weights, value)  # -1e30 is -inf in float16


class FusedDropsTheMask(ka.MultiHeadAttention):
    """Its fused path forgets the value mask: one variant disagrees with the others."""

    def call(self, query, value=None, key=None, query_mask=None, value_mask=None,
             use_causal_mask=False):  # fmt: skip
        value_mask = None if self.implementation == "fused" else value_mask
        return super().call(query, value, key, query_mask, value_mask,
                            use_causal_mask=use_causal_mask)  # fmt: skip


class ForgetsPaddingInCache(ka.MultiHeadAttention):
    """Writes every new token of a cached call as a valid key: the prompt's padding too."""

    def call(self, query, value=None, key=None, query_mask=None, value_mask=None,
             use_causal_mask=False, cache=None, cache_update_index=None):  # fmt: skip
        value_mask = None if cache is not None else value_mask
        return super().call(query, value, key, query_mask, value_mask,
                            use_causal_mask=use_causal_mask, cache=cache,
                            cache_update_index=cache_update_index)  # fmt: skip


class ProjectsEmptyRows(keras.layers.Layer):
    """Attention then a projection, with no zeroing: a row that sees nothing outputs the bias."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.projection = keras.layers.Dense(
            WIDTH, bias_initializer="ones", dtype=self.dtype_policy
        )

    def build(self, query_shape, value_shape, query_mask_shape=None, value_mask_shape=None):
        self.projection.build(tuple(value_shape))

    def call(self, query, value, query_mask=None, value_mask=None):
        heads, _ = ka.ops.attention(
            query[:, None], value[:, None], value[:, None], mask=value_mask[:, None, None, :],
            return_weights=False,
        )  # fmt: skip
        return self.projection(heads[:, 0])


def test_paths_agree_catches_a_mask_added_as_a_bias():
    """A huge padded value outweighs -1e30 in float32; in mixed_float16, where -1e30 is -inf,
    the forward pass survives and the backward pass is NaN."""
    kwargs = {"padding": {"value": "value_mask"}, "contents": ["huge"], "jit_compile": (False,)}
    testing.assert_paths_agree(ka.DotAttention(), FEED, **kwargs)
    path = r"^AddsAMaskBias \[default, {}, eager, huge content at padded steps\]: "
    with pytest.raises(AssertionError, match=path.format("float32") + "an output differs"):
        testing.assert_paths_agree(AddsAMaskBias(), FEED, policies=["float32"], **kwargs)
    with pytest.raises(
        AssertionError, match=path.format("mixed_float16") + "the gradient of input `query` is not"
    ):
        testing.assert_paths_agree(AddsAMaskBias(), FEED, policies=["mixed_float16"], **kwargs)


def test_paths_agree_catches_one_variant_that_drops_the_mask():
    layer = FusedDropsTheMask(2, 4)
    with pytest.raises(AssertionError, match=r"^FusedDropsTheMask \[implementation='fused', "):
        testing.assert_paths_agree(
            layer, FEED, {"value": "value_mask"}, variants=IMPLEMENTATIONS,
            reference={"implementation": "dense"}, policies=["float32"], jit_compile=(False,),
            gradients=False,
        )  # fmt: skip


def test_paths_agree_catches_an_empty_value_that_outputs_the_bias():
    case = TABLE["DotAttention"].cases["Tv=0"]
    with pytest.raises(AssertionError, match=r"the float64 reference.*not exactly zero"):
        testing.assert_paths_agree(
            ProjectsEmptyRows(), case.inputs, case.padding, zero_rows=case.zero_rows
        )


def test_cached_decoding_catches_padding_written_into_the_cache():
    layer = ForgetsPaddingInCache(2, 4)
    testing.assert_cached_decoding_agrees(ka.MultiHeadAttention(2, 4), DECODING_SEQUENCE,
                                          DECODING_MASK, jit_compile=(False,))  # fmt: skip
    with pytest.raises(AssertionError, match=r"eager, zeros content .*differs from the full"):
        testing.assert_cached_decoding_agrees(
            layer, DECODING_SEQUENCE, DECODING_MASK, contents=["zeros"], jit_compile=(False,)
        )


KEYS_ONLY = [
    pytest.param(
        name, overrides, id=f"{name}-{variant_name(overrides)}",
    )
    for name, entry in TABLE.items() if "Tv=5" in entry.cases for overrides in entry.variants
]  # fmt: skip


@pytest.mark.parametrize("name, overrides", KEYS_ONLY)
def test_nonfinite_keys_alone_reach_no_gradient(name, overrides):
    """inf and NaN in the padded keys and values only (the queries clean): eager, float32."""
    case = TABLE[name].cases["Tv=5"]
    testing.assert_paths_agree(
        layer_for(name, "Tv=5"), case.inputs, {"value": "value_mask"}, variants=[overrides],
        reference=TABLE[name].reference, policies=["float32"], contents=["inf", "nan"],
        jit_compile=(False,), zero_rows=case.zero_rows,
    )  # fmt: skip


class AttentionOp(keras.layers.Layer):
    """`keras_attn.ops.attention` on the inputs themselves (one head, no projection)."""

    def __init__(self, implementation="dense", **kwargs):
        super().__init__(**kwargs)
        self.implementation = implementation

    def call(self, query, value, value_mask):
        heads, _ = ka.ops.attention(
            query[:, None], value[:, None], value[:, None], mask=value_mask[:, None, None, :],
            implementation=self.implementation, return_weights=False,
        )  # fmt: skip
        return heads[:, 0]

    def get_config(self):
        return {**super().get_config(), "implementation": self.implementation}


@pytest.mark.parametrize(
    "implementation",
    [
        "dense",
        "fused",  # dS = P * (dO V^T - D) replaced by 0 at masked keys: 0 * inf was NaN
        "chunked",
    ],
)  # fmt: skip
def test_the_kernels_gradients_with_huge_masked_values(implementation):
    """The fast kernels' defect without weights in the way: the same on every backend."""
    testing.assert_paths_agree(
        AttentionOp(), FEED, {"value": "value_mask"},
        variants=[{"implementation": implementation}], policies=["float32"], contents=["huge"],
        jit_compile=(False,),
    )  # fmt: skip


def test_paths_agree_argument_errors():
    with pytest.raises(ValueError, match=r"`contents` hold 'huge', 'inf', 'nan' or 'zeros'"):
        testing.assert_paths_agree(ka.DotAttention(), FEED, {"value": "value_mask"},
                                   contents=["noise"])  # fmt: skip
    with pytest.raises(ValueError, match=r"must have shape \(batch, steps\)"):
        testing.assert_paths_agree(ka.DotAttention(), FEED, {"value": QUERY_MASK})
    with pytest.raises(ValueError, match=r"1 <= prompt_length <= T"):
        testing.assert_cached_decoding_agrees(
            ka.MultiHeadAttention(2, 4), DECODING_SEQUENCE, DECODING_MASK, prompt_length=0
        )
