"""Generation checks: a language model's greedy tokens do not depend on the batch or padding."""

from collections.abc import Sequence
from typing import Any

import numpy as np

EXTRA_PADDING = 2  # steps of padding beyond what the batch needs, in the padded variants


def assert_generation_batch_invariance(
    model: Any,
    prompts: Sequence[Sequence[int]] | np.ndarray,
    max_length: int,
    end_id: int | None = None,
    *,
    jit_compile: bool = True,
    **settings: Any,
) -> None:
    """Asserts that each prompt's greedy continuation is the same alone and in any batch.

        generate([p_i])[0] == generate(batch(p_1, ..., p_n))[i]     for every prompt i

    `keras_attn.models.generate` (greedy) continues each prompt alone (a batch of one),
    then all of them in three batches: right-padded to the longest prompt (the padding
    the batch needs), left-padded with `EXTRA_PADDING` (2) more steps in reverse order,
    and right-padded with as many more steps. Each row's tokens must equal its tokens
    alone, position for position: a model whose output leaks across the batch (a batch
    statistic) or depends on padding (padded keys attended, positions counting padding,
    a cache that forgets which positions are valid) fails. Tokens, not logits, are
    compared, as a served model's user sees them: ties at the argmax of an untrained
    model can flip on rounding, so check a trained model, or an untrained one whose
    logits are not nearly tied.

    Args:
        model: a language model that `keras_attn.models.generate` continues (built by
            `keras_attn.models.transformer_lm`).
        prompts: at least two prompts: a sequence of 1-D int token sequences of any
            lengths, or an int array `(B, P)`; token 0 is padding and is dropped, so each
            prompt needs a real token.
        max_length: new tokens per prompt.
        end_id: when given, a row stops at its first `end_id` (0 after it), as in
            `generate`.
        jit_compile: run `generate` compiled (TensorFlow's XLA, `jax.jit`; torch runs
            eagerly either way).
        **settings: more settings of `generate` (`sampler`, `top_k`, `penalty_alpha`,
            `num_return_sequences` ...; default greedy). With `num_return_sequences=n` each
            prompt's `n` rows are compared with its `n` rows alone (a seeded `"sample"`'s
            rows too: sample `j` draws from `seed + j`, whatever the batch); also
            `stop_sequences`, `min_new_tokens`, `repetition_penalty` ...

    Returns:
        None.

    Raises:
        AssertionError: a row differs from its prompt alone; the message names the
            prompt, the batch, the first differing step (0-based) and both token
            sequences.
        ValueError: fewer than two prompts, a prompt that is not a 1-D sequence of
            ints, or one without a real token; `generate`'s own for the model and
            the other arguments.

    Example:

    >>> from keras_attn import testing
    >>> from keras_attn.models import transformer_lm
    >>> keras.utils.set_random_seed(0)
    >>> model = transformer_lm(30, num_layers=1, num_heads=2, d_model=16, intermediate_dim=16)
    >>> prompts = [[5, 6, 7], [8, 9], [4]]  # eager: quicker than a compile per batch shape
    >>> testing.assert_generation_batch_invariance(model, prompts, 3, jit_compile=False)
    """
    from keras_attn.models import generate  # the zoo: imported when used, never by keras_attn

    rows = _prompt_rows(prompts)
    width = max(len(row) for row in rows)

    def continue_(batch):  # (B, n, max_length): each prompt's rows
        tokens = generate(model, batch, max_length, end_id, jit_compile=jit_compile, **settings)
        return np.asarray(tokens).reshape(len(batch), -1, max_length)

    alone = [continue_(row[None])[0] for row in rows]
    straight, reverse = np.arange(len(rows)), np.arange(len(rows))[::-1]
    extra = f"{EXTRA_PADDING} more padding steps than the batch needs"
    batches = (  # (how, the prompts' order in the batch, width, side)
        ("in the batch, right-padded to the longest prompt", straight, width, "right"),
        (f"in the batch in reverse order, left-padded with {extra}", reverse,
         width + EXTRA_PADDING, "left"),
        (f"in the batch, right-padded with {extra}", straight, width + EXTRA_PADDING, "right"),
    )  # fmt: skip
    for how, order, size, side in batches:
        tokens = continue_(_padded([rows[i] for i in order], size, side))[np.argsort(order)]
        for i, (got, want) in enumerate(zip(tokens, alone, strict=True)):
            differs = np.flatnonzero(np.any(got != want, axis=0))  # (n, T): any of its rows
            if differs.size:
                raise AssertionError(
                    f"Generation batch invariance: prompt {i} {how} differs from prompt {i} "
                    f"alone at step {int(differs[0])} (0-based) of {max_length}.\n"
                    f"  alone:        {_listed(want)}\n  in the batch: {_listed(got)}"
                )


def _listed(rows):
    """A prompt's `(n, T)` tokens as a list: its one row's (n = 1), else its rows'."""
    return rows[0].tolist() if len(rows) == 1 else rows.tolist()


def _prompt_rows(prompts):
    """The prompts' real tokens: a list of 1-D int arrays (0, padding, dropped)."""
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)
    if not isinstance(prompts, Sequence | np.ndarray) or len(prompts) < 2:
        raise ValueError(
            "`prompts` must hold at least 2 prompts (a sequence of token sequences or an int "
            f"array (B, P)). Received: prompts={prompts!r}"
        )
    rows = []
    for i, prompt in enumerate(prompts):
        row = np.asarray(prompt)
        if row.ndim != 1 or not np.issubdtype(row.dtype, np.integer) or not np.any(row != 0):
            raise ValueError(
                "Each prompt must be a 1-D sequence of int token ids with a real (not 0) "
                f"token. Received: prompts[{i}]={prompt!r}"
            )
        rows.append(row[row != 0].astype("int32"))
    return rows


def _padded(rows, width, side):
    """`(B, width)` int32: the rows padded with 0 on `side` ("left" or "right")."""
    batch = np.zeros((len(rows), width), "int32")
    for i, row in enumerate(rows):
        if side == "left":
            batch[i, width - len(row) :] = row
        else:
            batch[i, : len(row)] = row
    return batch
