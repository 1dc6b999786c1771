"""`GenerationConfig`: every generation setting, in one frozen object checked once.

Each setting declares its rule once (`Rule`): the Python types it takes, a predicate that
reads the same on a Python value and on a TensorFlow tensor, and the words of its error. The
config applies the rules when it is made (`__post_init__`), so a bad setting raises
`ValueError` naming it and the value received, whichever entry point it came through; an
exported `generate` signature takes the settings marked `exported` as scalar tensors and
gates them on the same predicates, in its graph (`keras_attn.models.generation.export`).

A config is hashable: the compiled loops are kept by it (`compile_key`).
"""

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from keras_attn.arguments import is_int

FLOAT32_MAX = float(np.finfo("float32").max)
SAMPLERS = ("greedy", "sample", "beam", "contrastive")
KV_CACHE_DTYPES = ("float", "int8")


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one setting is checked, in Python and in an exported graph.

    Args:
        kind: the Python values it takes: `"int"`, `"number"`, `"flag"` (a bool), `"ids"`
            (token ids), `"choice"` (one of `choices`), `"sequences"` (token-id sequences).
        must: what the value must be, in words: the error reads "`name` must be {must}.
            Received: name=value".
        holds: `holds(value, isfinite) -> bool` (a bool tensor for a tensor value): the
            value's range, with `isfinite` `math.isfinite` or `tf.math.is_finite`; None: any.
        optional: None is a value (off).
        exported: the dtype of the scalar an exported `generate` takes it as (None: not
            exported; there 0 stands for an integer's None, 1 for a fraction's).
        choices: for `"choice"`.
        shape: the shape of the tensor an exported `generate` takes it as (`()`: a scalar).
    """

    kind: str
    must: str
    holds: Callable[[Any, Callable], Any] | None = None
    optional: bool = False
    exported: str | None = None
    choices: tuple = ()
    shape: tuple = ()

    def message(self, name: str, value: Any) -> str:
        return f"`{name}` must be {self.must}. Received: {name}={value!r}"

    def check(self, name: str, value: Any) -> Any:
        """`value` as a Python value (NumPy numbers taken), or `ValueError` naming `name`."""
        if value is None and self.optional:
            return None
        if self.kind == "int":
            valid = is_int(value)
        elif self.kind == "number":
            valid = _number(value)
        elif self.kind == "flag":
            valid = isinstance(value, bool | np.bool_)
        elif self.kind == "choice":
            valid = isinstance(value, str) and value in self.choices
        else:  # token ids: checked by `check_suppress_ids`, `check_stop_sequences`
            valid = True
        if valid and self.holds is not None:
            valid = bool(self.holds(value, math.isfinite))
        if not valid:
            raise ValueError(self.message(name, value))
        if self.kind == "int":
            return int(value)
        if self.kind == "number":
            return float(value)
        if self.kind == "flag":
            return bool(value)
        return value


def _token_id(value, isfinite):
    return value > 0


# The settings' rules, one per name; `max_length` is a setting of every call, not of the config.
RULES = {
    "max_length": Rule("int", "a positive integer", lambda x, finite: x >= 1, exported="int32"),
    "sampler": Rule("choice", f"one of {SAMPLERS}", choices=SAMPLERS),
    "start_id": Rule("int", "a positive token id (0 is padding)", _token_id, optional=True),
    "end_id": Rule("int", "a positive token id (0 is padding)", _token_id, optional=True),
    "temperature": Rule(
        "number", "a finite number >= 0 (0 is greedy decoding)",
        lambda x, finite: finite(x) & (x >= 0), exported="float32",
    ),
    "top_k": Rule(
        "int", "None or an integer >= 0 (0 = off)", lambda x, finite: x >= 0, optional=True,
        exported="int32",
    ),
    "top_p": Rule(
        "number", "None or a number in (0, 1]", lambda x, finite: (x > 0) & (x <= 1),
        optional=True, exported="float32",
    ),
    "seed": Rule("int", "None or an integer", optional=True, exported="int32"),
    "suppress_ids": Rule("ids", "a sequence of token ids"),
    "repetition_penalty": Rule(
        "number",
        f"a positive number a float32 holds (at most {FLOAT32_MAX:.4g}; 1 = off)",
        lambda x, finite: finite(x) & (x > 0) & (x <= FLOAT32_MAX),
        optional=True, exported="float32",
    ),
    "no_repeat_ngram_size": Rule(
        "int", "a non-negative integer (0 = off)", lambda x, finite: x >= 0, optional=True
    ),
    "beam_width": Rule("int", "a positive integer", lambda x, finite: x >= 1),
    "length_penalty": Rule("number", "a finite number", lambda x, finite: finite(x)),
    "return_scores": Rule("flag", "True or False"),
    "return_alignment": Rule("flag", "True or False"),
    "num_return_sequences": Rule("int", "a positive integer", lambda x, finite: x >= 1),
    "penalty_alpha": Rule(
        "number", "a number in [0, 1]", lambda x, finite: finite(x) & (x >= 0) & (x <= 1)
    ),
    "kv_cache_dtype": Rule(
        "choice", "None, 'float' or 'int8'", optional=True, choices=KV_CACHE_DTYPES
    ),
    # An exported `generate` takes the stop sequences as strings, each spelled with the text
    # model's vocabulary into token ids (`keras_attn.models.text`).
    "stop_sequences": Rule(
        "sequences", "a sequence of non-empty sequences of token ids (e.g. [[5, 6], [2]])",
        exported="string", shape=(None,),
    ),
    "min_new_tokens": Rule(
        "int", "a non-negative integer (0 = off)", lambda x, finite: x >= 0, optional=True,
        exported="int32",
    ),
    "num_speculative_tokens": Rule(
        "int", "None or a positive integer (a draft model's tokens per round)",
        lambda x, finite: x >= 1, optional=True,
    ),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Every setting of the zoo's generation, checked once; frozen and hashable.

    `generate`, `greedy_decode`, `sample_decode`, `beam_search`, the text models and the
    `keras-attn predict` command build one from their keywords (the same tokens as the
    keywords), or take one as `config=` (keywords given too replace its fields). A bad field
    raises `ValueError` naming it and the value received (`RULES`); the ids are checked
    against a model's vocabulary when it is known (`check_vocabulary`).

    Args:
        sampler: `"greedy"`, `"sample"` or `"beam"` (the entry points of one kind set it).
        start_id: the token fed at the first step of a seq2seq decoder; None for a language
            model (it continues its prompt).
        end_id: a row stops at its first `end_id` (kept) and is padded with 0 after it.
        temperature, top_k, top_p, seed: of `"sample"` (`temperature=0` is greedy; `top_k`
            0 or None: off, kept as None; `top_p` None: off).
        suppress_ids: token ids never generated (kept as a sorted tuple).
        repetition_penalty: CTRL's penalty (None or 1: off; kept as 1.0).
        no_repeat_ngram_size: 0 (off; None too) or `n`: no n-gram twice in a row.
        beam_width, length_penalty: of `"beam"`.
        return_scores, return_alignment: also return the tokens' log-probabilities, the
            steps' alignment over the source.
        num_return_sequences: `n` sequences per prompt: `"sample"`: `n` draws (the rows
            `(B * n, max_length)`, grouped by prompt; sample `j` of a prompt draws what the
            prompt alone draws with `seed + j`); `"beam"`: the `n <= beam_width` best beams,
            best first. `"greedy"` and `"contrastive"` (deterministic) take 1 only.
        penalty_alpha: of `"contrastive"` (contrastive search among the `top_k` most
            likely tokens): the weight of the degeneration penalty, in `[0, 1]` (0 is greedy).
        kv_cache_dtype: None or `"float"` (kept as None): the KV caches in the model's
            compute dtype; `"int8"`: keys and values stored as int8 with a float32 scale
            per position and head (`keras_attn.cache.Int8Heads`), read back before the
            attention (a language model's caches).
        stop_sequences: token-id sequences (kept as a sorted tuple of tuples): a row stops
            at the first one its new tokens complete (kept), padded with 0 after it, as at
            `end_id`; a sequence begun in the prompt does not count.
        min_new_tokens: 0 (off; None too) or `m`: `end_id`, and a token that would complete
            a stop sequence, are ruled out while a row has fewer than `m` new tokens
            (Hugging Face's `min_new_tokens`).
        num_speculative_tokens: of speculative decoding (`generate(..., draft_model=)`):
            the tokens the draft proposes per round (None: 4).

    Example:

    >>> config = GenerationConfig(sampler="sample", top_k=0, suppress_ids=[3, 1])
    >>> config.top_k, config.suppress_ids, hash(config) == hash(GenerationConfig(
    ...     sampler="sample", suppress_ids=(1, 3)))
    (None, (1, 3), True)
    """

    sampler: str = "greedy"
    start_id: int | None = None
    end_id: int | None = None
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    suppress_ids: tuple[int, ...] = ()
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    beam_width: int = 4
    length_penalty: float = 0.6
    return_scores: bool = False
    return_alignment: bool = False
    num_return_sequences: int = 1
    penalty_alpha: float = 0.6
    kv_cache_dtype: str | None = None
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    min_new_tokens: int = 0
    num_speculative_tokens: int | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "suppress_ids":
                value = check_suppress_ids(value)
            elif field.name == "stop_sequences":
                value = check_stop_sequences(value)
            else:
                value = RULES[field.name].check(field.name, value)
            object.__setattr__(self, field.name, value)
        # The off values kept one way, so equal settings are equal configs (one compiled loop)
        object.__setattr__(self, "top_k", self.top_k or None)
        if self.repetition_penalty is None:
            object.__setattr__(self, "repetition_penalty", 1.0)
        if self.no_repeat_ngram_size is None:
            object.__setattr__(self, "no_repeat_ngram_size", 0)
        if self.min_new_tokens is None:
            object.__setattr__(self, "min_new_tokens", 0)
        if self.kv_cache_dtype == "float":
            object.__setattr__(self, "kv_cache_dtype", None)
        self._check_return_sequences()

    def _check_return_sequences(self):
        """`num_return_sequences` against the sampler (Hugging Face's rules) and `top_k` for
        contrastive search."""
        n = self.num_return_sequences
        if n > 1 and self.sampler in ("greedy", "contrastive"):
            raise ValueError(
                f"`num_return_sequences` must be 1 with sampler={self.sampler!r} (it gives one "
                "sequence per prompt; use sampler='sample' or 'beam'). "
                f"Received: num_return_sequences={n}"
            )
        if self.sampler == "beam" and n > self.beam_width:
            raise ValueError(
                "`num_return_sequences` must be at most `beam_width` (the beams kept). "
                f"Received: num_return_sequences={n}, beam_width={self.beam_width}"
            )
        if self.sampler == "contrastive" and not self.top_k:
            raise ValueError(
                "`top_k` must be a positive integer with sampler='contrastive' (the number of "
                f"candidates scored at each step). Received: top_k={self.top_k!r}"
            )

    @classmethod
    def exported(cls) -> tuple[str, ...]:
        """The settings an exported `generate` takes per request, as scalars, in order."""
        names = ("max_length", *(f.name for f in dataclasses.fields(cls)))
        return tuple(name for name in names if RULES[name].exported)

    def replace(self, **settings) -> "GenerationConfig":
        """This config with `settings` replaced (checked again)."""
        return dataclasses.replace(self, **settings) if settings else self

    @property
    def greedy(self) -> bool:
        """Whether each token is the argmax: `"greedy"`, or `"sample"` at temperature 0."""
        return self.sampler == "greedy" or (self.sampler == "sample" and self.temperature == 0)

    @property
    def compile_key(self) -> "GenerationConfig":
        """What a compiled loop depends on: the config without its `seed` (the draws are the
        loop's argument), and greedy decoding's without the sampling settings."""
        if self.sampler == "sample" and not self.greedy:
            return self.replace(seed=None)
        if self.sampler == "contrastive":
            return self.replace(temperature=1.0, top_p=None, seed=None)
        sampler = "beam" if self.sampler == "beam" else "greedy"
        n = self.num_return_sequences if sampler == "beam" else 1  # else: the rows repeated
        return self.replace(
            sampler=sampler, temperature=1.0, top_k=None, top_p=None, seed=None,
            num_return_sequences=n,
        )  # fmt: skip

    def check_vocabulary(self, vocab_size: int | None) -> "GenerationConfig":
        """`self`, or `ValueError` naming a `start_id`, `end_id` or `suppress_ids` outside
        `[1, vocab_size)` (`[0, vocab_size)` for `suppress_ids` and `stop_sequences`); None:
        not known."""
        check_lengths(1, self.start_id, self.end_id, vocab_size)
        check_suppress_ids(list(self.suppress_ids), vocab_size)  # (named as a list of ids)
        check_stop_sequences(self.stop_sequences, vocab_size)
        return self


def check_setting(name: str, value: Any) -> Any:
    """`value` checked by the rule of `name` (`RULES`), as a Python value."""
    return RULES[name].check(name, value)


def check_lengths(
    max_length: int, start_id: int | None, end_id: int | None, vocab_size: int | None = None
) -> tuple[int, int | None, int | None]:
    """The arguments as Python ints (NumPy ones taken), or `ValueError` naming the bad one.

    `max_length` must be a positive integer, the token ids (or None) in `[1, vocab_size)`
    (0 is padding; any positive id when `vocab_size` is None).
    """
    max_length = check_setting("max_length", max_length)
    below = f" below vocab_size={vocab_size}" if vocab_size is not None else ""
    ids = []
    for name, value in (("start_id", start_id), ("end_id", end_id)):
        if value is not None and (not is_int(value) or not 0 < value < (vocab_size or np.inf)):
            raise ValueError(
                f"`{name}` must be {RULES[name].must}{below}. Received: {name}={value!r}"
            )
        ids.append(None if value is None else int(value))
    return max_length, *ids


def check_suppress_ids(
    suppress_ids: Sequence[int] | np.ndarray, vocab_size: int | None = None
) -> tuple[int, ...]:
    """`suppress_ids` as a sorted tuple of Python ints (NumPy ones taken), or `ValueError`.

    A list, tuple, set or 1-D array of token ids in `[0, vocab_size)` (when `vocab_size` is
    given) that leaves a token besides padding to generate.
    """
    values = suppress_ids
    if isinstance(values, np.ndarray):
        values = values.tolist() if values.ndim == 1 else None  # NumPy ints -> Python ints
    in_range = f" in [0, vocab_size{'' if vocab_size is None else f'={vocab_size}'})"
    if not isinstance(values, list | tuple | set | frozenset | range) or not all(
        is_int(v) and 0 <= v < (vocab_size or np.inf) for v in values
    ):
        raise ValueError(
            f"`suppress_ids` must be {RULES['suppress_ids'].must}{in_range}. "
            f"Received: suppress_ids={suppress_ids!r}"
        )
    values = tuple(sorted({int(v) for v in values}))
    if vocab_size is not None and len({0, *values}) >= vocab_size:
        raise ValueError(
            "`suppress_ids` must leave a token besides padding (0) to generate. "
            f"Received: suppress_ids={suppress_ids!r}"
        )
    return values


def check_stop_sequences(
    stop_sequences: Sequence[Sequence[int]], vocab_size: int | None = None
) -> tuple[tuple[int, ...], ...]:
    """`stop_sequences` as a sorted tuple of tuples of Python ints (NumPy ones taken; each
    sequence once), or `ValueError` naming it.

    A list or tuple of sequences (lists, tuples, 1-D arrays), each of at least one token id
    in `[0, vocab_size)` (when `vocab_size` is given; 0 is a token of a model whose every id
    is one, `padding_id=-1`, and never generated by another). A flat list of ids is not
    taken: `[[5, 6]]` is the sequence 5 6, `[[5], [6]]` two sequences.

    Example:

    >>> check_stop_sequences([[7, 8], np.array([3]), (7, 8)])
    ((3,), (7, 8))
    """
    values = stop_sequences
    if isinstance(values, np.ndarray):
        values = list(values) if values.ndim == 2 else None
    sequences = []
    in_range = f" in [0, vocab_size{'' if vocab_size is None else f'={vocab_size}'})"
    valid = isinstance(values, list | tuple)
    for sequence in values if valid else ():
        if isinstance(sequence, np.ndarray):
            sequence = sequence.tolist() if sequence.ndim == 1 else None
        if (
            not isinstance(sequence, list | tuple)
            or not sequence
            or not all(is_int(v) and 0 <= v < (vocab_size or np.inf) for v in sequence)
        ):
            valid = False
            break
        sequences.append(tuple(int(v) for v in sequence))
    if not valid:
        raise ValueError(
            f"`stop_sequences` must be {RULES['stop_sequences'].must}{in_range}. "
            f"Received: stop_sequences={stop_sequences!r}"
        )
    return tuple(sorted(set(sequences)))


def check_repetition_penalty(value: float | None) -> float:
    """`repetition_penalty` as a Python float (None: 1.0, off), or `ValueError` naming it.

    Example:

    >>> check_repetition_penalty(None), check_repetition_penalty(2)
    (1.0, 2.0)
    """
    value = check_setting("repetition_penalty", value)
    return 1.0 if value is None else value


def check_no_repeat_ngram_size(value: int | None) -> int:
    """`no_repeat_ngram_size` as a Python int (None: 0, off), or `ValueError` naming it.

    Example:

    >>> check_no_repeat_ngram_size(None), check_no_repeat_ngram_size(3)
    (0, 3)
    """
    return check_setting("no_repeat_ngram_size", value) or 0


def config_from(
    config: GenerationConfig | None,
    names: Sequence[str],
    args: tuple,
    settings: dict,
    entry: str,
    calls: Sequence[str] = (),
    **fixed,
) -> tuple[GenerationConfig, dict]:
    """The config of an entry point's call, and its other arguments (`calls`).

    `args` are the positional arguments after the entry's own, read as `names` (today's
    order of its keywords); `settings` its keywords. Settings given replace `config`'s
    fields; `fixed` (the entry point's `sampler`) replaces them all.

    Raises:
        TypeError: too many positional arguments, an argument given twice, or an
            unknown keyword, as Python words them.
    """
    if len(args) > len(names):
        raise TypeError(
            f"{entry}() takes {len(names)} optional positional arguments after its first "
            f"ones. Received: {len(args)}"
        )
    for name, value in zip(names, args, strict=False):
        if name in settings:
            raise TypeError(f"{entry}() got multiple values for argument '{name}'")
        settings[name] = value
    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"`config` must be a GenerationConfig or None. Received: config={config!r}")
    fields = {f.name for f in dataclasses.fields(GenerationConfig)}
    other = {name: settings.pop(name) for name in list(settings) if name in calls}
    unknown = sorted(set(settings) - fields)
    if unknown:
        raise TypeError(f"{entry}() got an unexpected keyword argument '{unknown[0]}'")
    settings.update(fixed)
    if config is None:
        return GenerationConfig(**settings), other
    return config.replace(**settings), other
