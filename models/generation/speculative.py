"""Speculative decoding: a small draft model proposes tokens, the target verifies them at once.

A round (`SpeculativeLoop.round`): the draft, fed the last token, proposes `k` tokens one
cached step at a time (`k = num_speculative_tokens`); the target reads the last token and
the `k` proposals in one step of `k + 1` tokens (`LanguageModelSteps.extend`), which gives
its next-token logits at every one of them. Both sets of logits go through the config's
logits processors (each position with its own history: the prompt, the tokens so far, the
proposals before it). Then:

- greedy: proposal `d_j` is accepted while it is the target's argmax; the round emits the
  target's argmax at every accepted position and the one after: the target's own greedy
  tokens, token for token;
- sampling (Leviathan et al. 2023; Chen et al. 2023): with `q_j`, `p_j` the draft's and the
  target's sampling distributions (the config's temperature, top-k and top-p on the
  processed logits of each), `d_j ~ q_j` is accepted with probability
  `min(1, p_j(d_j) / q_j(d_j))`; at the first rejection the token is drawn from
  `norm(max(0, p_j - q_j))`, and after `k` acceptances a bonus token from `p_{k+1}`. Every
  token is then distributed as the target's own sampling would draw it.

The rows of a batch stay in lockstep: a round keeps the batch's smallest number of accepted
proposals `n` (a finished row does not count) and every row emits `n + 1` tokens: its `n`
accepted proposals and, at position `n + 1`, its proposal where it accepted it, else its
rejection (or bonus) draw. Still exact (each emitted token came out of the rule at its
position), one cache index for the batch, and the caches rolled back by moving it: the
positions after it hold rejected keys that the next round overwrites before any query can
see them (the causal mask hides them until then); nothing is copied.
"""

import weakref
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attn._execution import no_gradients
from keras_attn._typing import TensorLike
from keras_attn.matmul_einsum_dense import loop_kernels

from ..transformer_lm import LanguageModelSteps, check_prompts
from .compiled import _compile, _CompiledLoops
from .config import FLOAT32_MAX, GenerationConfig
from .loop import DecodingLoop, token_scores
from .samplers import greedy_tokens, top_k_lowest_first

DEFAULT_SPECULATIVE_TOKENS = 4
_COMPILED = weakref.WeakKeyDictionary()  # target -> WeakKeyDictionary(draft -> _CompiledLoops)


class SpeculativeStats(NamedTuple):
    """How a speculative `generate` went (`return_acceptance=True`).

    Args:
        acceptance_rate: the draft's proposals the rule accepted, over those it made: per
            row and round, the accepted prefix of the `k` proposals (before the batch's
            lockstep), summed, over `k` times the rows decoding at that round.
        tokens_per_round: the new tokens per row over the rounds (each one target step of
            `k + 1` tokens; plain decoding makes 1 a step): at most `k + 1`.
        rounds: the rounds run.
    """

    acceptance_rate: float
    tokens_per_round: float
    rounds: int


class SpeculativeCarry(NamedTuple):
    """What the speculative loop carries from round to round.

    Args:
        tokens: int32 `(B,)`, the last token of every row, not fed to either model yet.
        outputs: int32 `(B, max_length + k)`, the tokens so far (0 after a row's end).
        finished: bool `(B,)`, the rows that emitted `end_id`.
        count: int32 scalar, the new tokens of every row so far.
        rounds: int32 scalar.
        accepted, proposed: float32 scalars, the proposals accepted and made (the stats).
        target, draft: the two models' `LanguageModelState`s.
        before: int32 `(B, K)`, the prompts, where a logits processor reads the history;
            else `()`.
        scores: float32 `(B, max_length + k)` (`return_scores`), else `()`.
    """

    tokens: Any
    outputs: Any
    finished: Any
    count: Any
    rounds: Any
    accepted: Any
    proposed: Any
    target: Any
    draft: Any
    before: Any = ()
    scores: Any = ()


def sampling_probabilities(
    logits: TensorLike,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> TensorLike:
    """float32 `(B, V)`: the distribution `sample_tokens` draws from, in token-id order.

    `softmax((logits - max) / temperature)` over the `top_k` most likely tokens (ties: the
    lowest id), cut to the top-p nucleus (a token is kept while the mass before it is below
    `top_p`) and renormalized; a temperature whose inverse float32 cannot hold (0 included),
    or `top_k=1`, is one-hot at the argmax. The settings are Python numbers.

    Example:

    >>> logits = np.log(np.array([[0.5, 0.3, 0.2]], "float32"))
    >>> print(np.round(ops.convert_to_numpy(sampling_probabilities(logits, top_p=0.7)), 3))
    [[0.625 0.375 0.   ]]
    """
    logits = ops.cast(logits, "float32")
    vocab = logits.shape[-1]
    k = vocab if not top_k else min(top_k, vocab)
    if float(temperature) * FLOAT32_MAX < 1:
        k = 1
    if k == 1:
        return ops.one_hot(greedy_tokens(logits), vocab, dtype="float32")
    inverse = 1.0 / float(temperature)
    best = ops.max(logits, axis=-1, keepdims=True)  # (B, 1)
    if k == vocab and top_p is None:  # nothing cut: no sort
        return ops.softmax((logits - best) * inverse, axis=-1)
    values, ids = top_k_lowest_first(logits, vocab)  # (B, V), most likely first
    scaled = ops.where(ops.arange(vocab) < k, (values - best) * inverse, float("-inf"))
    probs = ops.softmax(scaled, axis=-1)
    if top_p is not None:
        before = ops.cumsum(probs, axis=-1) - probs  # the mass of the more likely tokens
        probs = ops.where(before < top_p, probs, 0.0)
        probs = probs / ops.sum(probs, axis=-1, keepdims=True)
    return ops.take_along_axis(probs, ops.argsort(ids, axis=-1), axis=-1)  # id order


def draw(probs: TensorLike, uniform: TensorLike) -> TensorLike:
    """int32 `(B,)`: a token drawn from each row of `probs` `(B, V)` (not necessarily
    normalized) by inverse CDF from `uniform` `(B,)` in `[0, 1)`; never a token of
    probability 0."""
    vocab = probs.shape[-1]
    cdf = ops.cumsum(probs, axis=-1)
    threshold = ops.expand_dims(ops.cast(uniform, "float32"), -1) * cdf[:, -1:]  # (B, 1)
    token = ops.sum(ops.cast(cdf <= threshold, "int32"), axis=-1)
    last = ops.max(ops.where(probs > 0, ops.arange(vocab, dtype="int32"), 0), axis=-1)
    return ops.minimum(token, last)  # rounding could only pass the last possible token


class SpeculativeLoop:
    """Speculative decoding of a target language model with a draft one (module docstring).

    `start(prompts)` gives the first `SpeculativeCarry`, `round(carry, uniform)` the carry
    after one round, `run(prompts, uniform)` every round (one `ops.while_loop`, until every
    row has `max_length` tokens or has ended).

    Args:
        target, draft: `LanguageModelSteps` of the full caches (`ring=False`).
        config: the `GenerationConfig` (sampler `"greedy"` or `"sample"`).
        max_length: the new tokens per row.
    """

    def __init__(self, target, draft, config: GenerationConfig, max_length: int):
        self.target, self.draft, self.config = target, draft, config
        self.k = config.num_speculative_tokens or DEFAULT_SPECULATIVE_TOKENS
        self.max_length = max_length
        self.loop = DecodingLoop(target, config)  # its start, logits processors, padding

    def start(self, prompts: TensorLike) -> SpeculativeCarry:
        length = self.max_length + self.k  # room for the last round's proposals
        first = self.loop.start(prompts, length)
        zero = ops.zeros((), "int32")
        return SpeculativeCarry(
            tokens=first.tokens,
            outputs=first.outputs,
            finished=first.finished,
            count=zero,
            rounds=zero,
            accepted=ops.zeros((), "float32"),
            proposed=ops.zeros((), "float32"),
            target=first.state,
            draft=self.draft.start(prompts, length),
            before=first.before,
            scores=first.scores,
        )

    def _process(self, logits, carry, outputs, index):
        """The config's logits processors on `logits` `(B, V)` at new token `index`, whose
        history is `outputs[:, :index]` (the proposals after it cleared)."""
        if self.loop.needs_history:
            written = ops.arange(ops.shape(outputs)[1], dtype="int32") < index
            outputs = ops.where(written, outputs, 0)
        return self.loop.process(logits, carry._replace(outputs=outputs), index)

    def _distribution(self, logits):
        config = self.config
        return sampling_probabilities(logits, config.temperature, config.top_k, config.top_p)

    def round(self, carry: SpeculativeCarry, uniform: TensorLike) -> SpeculativeCarry:
        """The carry after one round; `uniform` `(B, 2k + 1)` draws in `[0, 1)`."""
        k, count, greedy = self.k, carry.count, self.config.greedy
        # The draft proposes k tokens, then is fed the last one (its cache then holds all k).
        outputs, state, token = carry.outputs, carry.draft, carry.tokens
        proposals, draft_probs = [], []
        for j in range(k + 1):
            logits, state = self.draft.step(token, count + j, state)
            if j == k:
                break
            logits = self._process(logits, carry, outputs, count + j)
            if greedy:
                token = greedy_tokens(logits)
            else:
                draft_probs.append(self._distribution(logits))
                token = draw(draft_probs[-1], uniform[:, j])
            proposals.append(token)
            outputs = _write(outputs, count + j, ops.expand_dims(token, 1))
        proposed = ops.stack(proposals, axis=1)  # (B, k)
        # The target reads the last token and the k proposals at once: (B, k + 1, V).
        fed = ops.concatenate([ops.expand_dims(carry.tokens, 1), proposed], axis=1)
        raw, target_state = self.target.extend(fed, carry.target)
        processed = [self._process(raw[:, j], carry, outputs, count + j) for j in range(k + 1)]
        if greedy:
            best = ops.stack([greedy_tokens(logits) for logits in processed], axis=1)
            accepts = ops.equal(proposed, best[:, :k])  # (B, k)
        else:
            target_probs = ops.stack([self._distribution(p) for p in processed], axis=1)
            draft_stack = ops.stack(draft_probs, axis=1)  # (B, k, V)
            at = ops.expand_dims(proposed, -1)
            p = ops.take_along_axis(target_probs[:, :k], at, axis=-1)[..., 0]  # (B, k)
            q = ops.take_along_axis(draft_stack, at, axis=-1)[..., 0]
            accepts = uniform[:, k : 2 * k] * q < p  # probability min(1, p / q)
        accepted = ops.cast(ops.cumprod(ops.cast(accepts, "int32"), axis=1), "bool")  # (B, k)
        row_accepted = ops.sum(ops.cast(accepted, "int32"), axis=1)  # (B,)
        # A row that ended, or ends among its accepted proposals, does not hold the batch back.
        done = carry.finished
        if self.config.end_id is not None:
            ends = ops.logical_and(accepted, ops.equal(proposed, self.config.end_id))
            done = ops.logical_or(done, ops.any(ends, axis=1))
        n = ops.min(ops.where(done, k, row_accepted), initial=k)  # the batch's lockstep
        position = ops.arange(k + 1, dtype="int32")  # (k + 1,)
        if greedy:
            tokens = best  # the target's argmax: the accepted proposals, then its choice
        else:  # at position n: the proposal where accepted, else the rejection (bonus) draw
            zeros = ops.zeros_like(target_probs[:, :1])
            q_next = ops.take(ops.concatenate([draft_stack, zeros], axis=1), n, axis=1)
            p_next = ops.take(target_probs, n, axis=1)  # (B, V)
            residual = ops.maximum(p_next - q_next, 0.0)
            total = ops.sum(residual, axis=-1, keepdims=True)
            residual = ops.where(total > 0, residual, p_next)  # p == q: never rejected
            drawn = draw(residual, uniform[:, 2 * k])
            padded = ops.concatenate([proposed, ops.zeros_like(proposed[:, :1])], axis=1)
            own = ops.where(ops.take(ops.concatenate([accepted, accepted[:, :1]], 1), n, 1),
                            ops.take(padded, n, axis=1), drawn)  # fmt: skip
            tokens = ops.where(position == n, ops.expand_dims(own, 1), padded)
        tokens = ops.where(position <= n, tokens, 0)  # (B, k + 1): n + 1 tokens a row
        finished = carry.finished
        ended = ops.expand_dims(finished, 1)
        if self.config.end_id is not None:  # zeros after a row's end
            is_end = ops.cast(ops.equal(tokens, self.config.end_id), "int32")
            ended = ops.logical_or(ended, (ops.cumsum(is_end, axis=1) - is_end) > 0)
            finished = ops.logical_or(finished, ops.any(is_end > 0, axis=1))
        tokens = ops.where(ended, 0, tokens)
        new = {}
        if self.config.return_scores:
            scores = ops.stack([token_scores(raw[:, j], tokens[:, j]) for j in range(k + 1)], 1)
            new["scores"] = _write(carry.scores, count, ops.where(ended, 0.0, scores))
        active = ops.cast(ops.logical_not(carry.finished), "float32")
        moved = n + 1
        return carry._replace(
            tokens=ops.take(tokens, n, axis=1),
            outputs=_write(outputs, count, tokens),
            finished=finished,
            count=count + moved,
            rounds=carry.rounds + 1,
            accepted=carry.accepted + ops.sum(active * ops.cast(row_accepted, "float32")),
            proposed=carry.proposed + ops.sum(active) * float(k),
            target=_rolled_back(target_state, carry.target, moved),
            draft=_rolled_back(state, carry.draft, moved),
            **new,
        )

    def run(self, prompts: TensorLike, uniform: TensorLike) -> tuple:
        """Every round: `(tokens (B, max_length), [scores,] stats (4,))`, the stats float32:
        the proposals accepted and made, the rounds, the new tokens of a row (at most
        `max_length`)."""

        def going(carry):
            return ops.logical_and(
                carry.count < self.max_length, ops.logical_not(ops.all(carry.finished))
            )

        def one_round(carry):
            return (self.round(carry, ops.take(uniform, carry.rounds, axis=0)),)

        (carry,) = ops.while_loop(going, one_round, (self.start(prompts),))
        stats = ops.stack(
            [carry.accepted, carry.proposed, ops.cast(carry.rounds, "float32"),
             ops.cast(ops.minimum(carry.count, self.max_length), "float32")]
        )  # fmt: skip
        result = (carry.outputs[:, : self.max_length],)
        if self.config.return_scores:
            result += (carry.scores[:, : self.max_length],)
        return (*result, stats)


def _write(buffer, index, values):
    """`buffer[:, index : index + T] = values` `(B, T)`."""
    return ops.slice_update(buffer, (0, index), ops.cast(values, buffer.dtype))


def _rolled_back(state, before, moved):
    """`state` (after a step of `k + 1` tokens) as if only `moved` of them had been fed: its
    position and cache index moved on from `before`'s; the keys after them stay in the
    caches, to be overwritten by the next round's."""
    return state._replace(
        positions=before.positions + moved, cache_index=before.cache_index + moved
    )


def check_draft_model(target, draft_model, config: GenerationConfig) -> LanguageModelSteps:
    """The draft's `LanguageModelSteps` (full caches), or `ValueError` naming `draft_model`:
    not a `transformer_lm`, another vocabulary or padding id than the target's, a sampler
    other than greedy and sampling, or `num_return_sequences` above 1."""
    if not isinstance(draft_model, keras.Model) or not LanguageModelSteps.matches(draft_model):
        raise ValueError(
            "`draft_model` must be a model built by keras_attn.models.transformer_lm. "
            f"Received: draft_model={draft_model!r}"
        )
    if config.sampler not in ("greedy", "sample"):
        raise ValueError(
            "`draft_model` (speculative decoding) works with sampler='greedy' or 'sample'. "
            f"Received: draft_model={draft_model.name!r}, sampler={config.sampler!r}"
        )
    if config.stop_sequences:
        raise ValueError(
            "`draft_model` (speculative decoding) does not take `stop_sequences` yet (`end_id` "
            f"it does). Received: draft_model={draft_model.name!r}, "
            f"stop_sequences={config.stop_sequences}"
        )
    if config.num_return_sequences != 1:
        raise ValueError(
            "`draft_model` (speculative decoding) gives one sequence per prompt: repeat the "
            f"prompts instead. Received: draft_model={draft_model.name!r}, "
            f"num_return_sequences={config.num_return_sequences}"
        )
    target_steps, draft = LanguageModelSteps(target), LanguageModelSteps(draft_model, ring=False)
    if (draft.vocab_size, draft.padding_id) != (target_steps.vocab_size, target_steps.padding_id):
        raise ValueError(
            "`draft_model` must share the target's vocabulary (size and padding id). Received: "
            f"draft_model with vocab_size={draft.vocab_size}, padding_id={draft.padding_id}; "
            f"the target's: vocab_size={target_steps.vocab_size}, "
            f"padding_id={target_steps.padding_id}"
        )
    return draft


def speculative_generate(
    target: keras.Model,
    draft_model: keras.Model,
    prompts: np.ndarray,
    max_length: int,
    config: GenerationConfig,
    jit_compile: bool | str = "auto",
    return_acceptance: bool = False,
    stream: bool = False,
) -> Any:
    """`generate(target, prompts, max_length, draft_model=...)`: the speculative loop,
    compiled on TensorFlow (XLA) and JAX unless `jit_compile=False`; torch runs eagerly.
    Called by `generate` with its checked config and prompts.

    Returns:
        The tokens `(B, max_length)` as `generate`'s (with `return_scores`, `(tokens,
        scores)`), and with `return_acceptance` a `SpeculativeStats` after them; with
        `stream`, `generate`'s iterator of each step's `(B,)` tokens (a round compiled
        apart: its tokens come together, as soon as it has run).
    """
    draft_steps = check_draft_model(target, draft_model, config)
    k = config.num_speculative_tokens or DEFAULT_SPECULATIVE_TOKENS
    target_steps = LanguageModelSteps(target, ring=False)
    for steps in (target_steps, draft_steps):  # the last round may propose k tokens past the end
        check_prompts(prompts, steps.vocab_size, max_length + k, steps.sequence_length,
                      steps.padding_id)  # fmt: skip
    if stream and return_acceptance:
        raise ValueError(
            "`return_acceptance` reports on a whole call: not with `stream=True`. Received: "
            "return_acceptance=True, stream=True"
        )
    batch = prompts.shape[0]
    if batch == 0:
        tokens, scores = np.zeros((0, max_length), "int32"), np.zeros((0, max_length), "float32")
        if stream:
            return iter([(tokens[:, 0], scores[:, 0]) if config.return_scores else tokens[:, 0]]
                        * max_length)  # fmt: skip
        outputs = (tokens, scores) if config.return_scores else (tokens,)
        stats = SpeculativeStats(0.0, 0.0, 0)
    else:
        uniform = keras.random.uniform((max_length, batch, 2 * k + 1), seed=config.seed)
        refs = weakref.ref(target), weakref.ref(draft_model)

        def speculative_loop():  # traced inside the compiled functions: no model held
            target, draft = (
                LanguageModelSteps(ref(), ring=False, kv_cache_dtype=config.kv_cache_dtype)
                for ref in refs
            )
            return SpeculativeLoop(target, draft, config, max_length)

        def run(prompts, uniform):
            layers = [layer for ref in refs for layer in ref()._flatten_layers()]
            with loop_kernels(layers):  # TensorFlow under XLA: the kernels read once
                return speculative_loop().run(prompts, uniform)

        def start(prompts):
            return speculative_loop().start(prompts)

        def one_round(carry, uniform):
            return speculative_loop().round(carry, uniform)

        compiled = jit_compile and keras.backend.backend() != "torch"
        key = (config.compile_key, max_length)
        if stream:
            if compiled:
                start = _compiled_loop(target, draft_model, key + ("start",), start)
                one_round = _compiled_loop(target, draft_model, key + ("round",), one_round)
            return _stream(start, one_round, prompts, uniform, max_length, config,
                           (target, draft_model))  # fmt: skip
        if compiled:
            run = _compiled_loop(target, draft_model, key, run)
        with no_gradients(target, draft_model):  # torch: their layers call plainly
            *outputs, stats = (np.asarray(ops.convert_to_numpy(v)) for v in run(prompts, uniform))
        accepted, proposed, rounds, count = stats.tolist()
        stats = SpeculativeStats(
            accepted / proposed if proposed else 0.0, count / rounds if rounds else 0.0,
            int(rounds),
        )  # fmt: skip
    outputs = tuple(outputs) if config.return_scores else outputs[0]
    if not return_acceptance:
        return outputs
    return (*outputs, stats) if config.return_scores else (outputs, stats)


def _stream(start, one_round, prompts, uniform, max_length, config, models):
    """The iterator of `generate(..., draft_model=, stream=True)`: each new token's `(B,)`
    tokens (and scores), a round's tokens as soon as it has run; the same rounds and draws
    as the one-shot loop. Once every row has ended, zeros without running the models."""
    with no_gradients(*models):  # per call: a generator must not hold it across its yields
        carry = start(prompts)
    ended = np.zeros(prompts.shape[0], bool)
    emitted = rounds = 0
    while emitted < max_length:
        if ended.all():
            tokens, scores = np.zeros(len(ended), "int32"), np.zeros(len(ended), "float32")
            emitted += 1
            yield (tokens, scores) if config.return_scores else tokens
            continue
        with no_gradients(*models):
            carry = one_round(carry, ops.take(uniform, rounds, axis=0))
        rounds += 1
        count = min(int(ops.convert_to_numpy(carry.count)), max_length)
        outputs = np.asarray(ops.convert_to_numpy(carry.outputs))
        if config.return_scores:
            all_scores = np.asarray(ops.convert_to_numpy(carry.scores))
        for index in range(emitted, count):
            tokens = outputs[:, index]
            if config.end_id is not None:
                ended |= tokens == config.end_id
            yield (tokens, all_scores[:, index]) if config.return_scores else tokens
        emitted = count


def _compiled_loop(target, draft, key, loop):
    """`loop` compiled for `target` and `draft` (both models' variables passed: a JAX loop
    reads them as arguments), kept while both live and traced again after a change of
    either's variables."""
    variables = (*target.variables, *draft.variables)
    by_draft = _COMPILED.setdefault(target, weakref.WeakKeyDictionary())
    functions = by_draft.get(draft)
    if functions is None or not functions.traced_with(variables):
        functions = by_draft[draft] = _CompiledLoops(variables)
    if key not in functions:
        functions[key] = _compile(variables, loop)
    return functions[key]
