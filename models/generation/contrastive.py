"""Contrastive search: the decoding loop choosing, among the `top_k` most likely tokens, the
one whose hidden state is least like the row's earlier tokens'.

At each step, with `p` the softmax of the processed logits (padding and `suppress_ids` ruled
out, then the repetition controls; no temperature, top-p or draw) and `V_k` its `top_k` most
likely tokens,

    y_t = argmax_{v in V_k} (1 - alpha) p(v) - alpha max_{j < t} cos(h_v, h_j)

where `h_v` is the final hidden state (after the final norm: what the logits project) of the
model fed `v` at position `t`, and `h_j` those of the row's earlier tokens: its prompt's real
tokens (padding left out) and its outputs so far (keras-hub's `ContrastiveSampler` and Hugging
Face's `penalty_alpha` compare the prompt's too). `alpha = penalty_alpha`; 0 is greedy
decoding. Ties go to the more likely candidate (then the lower id).

Each step runs the model once on the `B * k` candidates (the decoding state repeated `k` times
per row, as keras-hub does), then keeps the chosen candidate's state, logits and hidden state:
they are the next step's (no second pass). The first logits come from a step at the start,
which feeds the prompts' last tokens. The loop carries `ContrastiveState` as its `Carry.state`.

Reference:
    Su et al., 2022, "A Contrastive Framework for Neural Text Generation",
    https://arxiv.org/abs/2202.06417
"""

import inspect
from typing import Any, NamedTuple

import keras
from keras import ops

from keras_attn._typing import TensorLike

from ..transformer_lm import left_align
from .config import GenerationConfig
from .loop import Carry, DecodingLoop, token_scores, write
from .samplers import top_k_lowest_first
from .steps import first_tokens


class ContrastiveState(NamedTuple):
    """`Carry.state` of contrastive search.

    Args:
        state: the decoding steps' state after the last chosen token.
        logits: `(B, V)`, the next-token logits after it.
        hidden: float32 `(B, P + max_length, d)`: the final hidden states of the row's
            left-aligned prompt (`P` positions) then of its outputs (written as chosen).
        prompt: bool `(B, P)`: the prompt's real positions (not padding).
    """

    state: Any
    logits: Any
    hidden: Any
    prompt: Any


def check_hidden_steps(steps: Any) -> None:
    """`ValueError` unless `steps` can return hidden states (a language model's steps:
    `start` and `step` take `return_hidden`, and it continues its prompt)."""
    has = all(
        "return_hidden" in inspect.signature(getattr(steps, name)).parameters
        for name in ("start", "step")
    )
    if not has or not hasattr(steps, "start_tokens"):
        raise ValueError(
            "sampler='contrastive' compares hidden states: it needs a language model's "
            f"decoding steps with `return_hidden` ({type(steps).__name__} has none). "
            "Received: sampler='contrastive'"
        )


class ContrastiveLoop(DecodingLoop):
    """`DecodingLoop` of contrastive search (`sampler="contrastive"`, `top_k`,
    `penalty_alpha`): `start_state` prefills the prompts and runs their last tokens; each `step`
    scores the `top_k` candidates of every row and keeps the best (`record`). Streams as the
    plain loop does (`generate(..., stream=True)`).

    Args:
        steps: a language model's decoding steps (`LanguageModelSteps`).
        config: a `GenerationConfig` with `sampler="contrastive"`.
        choose, tensors: as `DecodingLoop`'s (`choose` is not used).

    Raises:
        ValueError: steps without hidden states (`check_hidden_steps`).
    """

    def __init__(self, steps, config: GenerationConfig, choose=None, tensors=None):
        check_hidden_steps(steps)
        super().__init__(steps, config, choose, tensors)

    def start_state(self, encoder_inputs: TensorLike, max_length) -> ContrastiveState:
        """The steps started for one more position than `max_length` (the last step scores
        its candidates one position past the last output), fed the prompts' last tokens."""
        state, context = self.steps.start(encoder_inputs, max_length + 1, return_hidden=True)
        tokens = first_tokens(self.steps, encoder_inputs, None)
        logits, state, last = self.steps.step(tokens, 0, state, return_hidden=True)
        batch, width = ops.shape(context)[0], ops.shape(context)[2]
        hidden = ops.concatenate(
            [
                ops.cast(context, "float32"),  # (B, P - 1, d)
                ops.cast(last, "float32")[:, None],  # (B, 1, d): the prompt's last token
                ops.zeros((batch, max_length, width), "float32"),  # the outputs' (not yet)
            ],
            axis=1,
        )
        prompt = ops.not_equal(left_align(encoder_inputs, self.padding_id), self.padding_id)
        return ContrastiveState(state, logits, hidden, prompt)

    def step(self, index, carry: Carry) -> Carry:
        """The carry after the `index`-th token of every row (0 for a finished row)."""
        config, current = self.config, carry.state
        logits = current.logits
        processed = ops.cast(self.process(logits, carry, index), "float32")  # (B, V)
        batch, vocab = ops.shape(processed)[0], processed.shape[-1]
        k = min(config.top_k, vocab) if isinstance(vocab, int) else config.top_k
        probs, candidates = top_k_lowest_first(ops.softmax(processed, axis=-1), k)  # (B, k)
        ruled_out = ops.take_along_axis(processed, candidates, axis=-1) == float("-inf")
        repeated = keras.tree.map_structure(lambda s: ops.repeat(s, k, axis=0), current.state)
        next_logits, state, hidden = self.steps.step(
            ops.reshape(candidates, (-1,)), index + 1, repeated, return_hidden=True
        )  # (B*k, V), (B*k, ...), (B*k, d)
        hidden = ops.reshape(ops.cast(hidden, "float32"), (batch, k, -1))  # (B, k, d)
        similarity = _max_similarity(hidden, current, index)  # (B, k)
        alpha = config.penalty_alpha
        score = (1.0 - alpha) * probs - alpha * similarity
        score = ops.where(ruled_out, float("-inf"), score)  # never padding nor a suppressed id
        best = ops.cast(ops.argmax(score, axis=-1), "int32")  # (B,): the first best
        chosen = ops.take_along_axis(candidates, best[:, None], axis=-1)[:, 0]
        tokens = ops.where(carry.finished, 0, chosen)
        scores = token_scores(logits, tokens) if config.return_scores else None
        rows = ops.arange(batch, dtype="int32") * k + best  # (B,) in the B*k candidates
        kept = keras.tree.map_structure(lambda s: ops.take(s, rows, axis=0), state)
        slot = ops.shape(current.prompt)[1] + index  # the output's position in `hidden`
        chosen_hidden = ops.take_along_axis(hidden, best[:, None, None], axis=1)[:, 0]  # (B, d)
        new = ContrastiveState(
            state=kept,
            logits=ops.take(next_logits, rows, axis=0),
            hidden=write(current.hidden, slot, chosen_hidden),
            prompt=current.prompt,
        )
        return self.record(carry, index, tokens, new, scores)


def _max_similarity(hidden: TensorLike, current: ContrastiveState, index) -> TensorLike:
    """float32 `(B, k)`: each candidate's largest cosine similarity to the row's earlier
    hidden states (the prompt's real positions and the outputs before `index`)."""
    earlier = current.hidden  # (B, S, d)
    dots = ops.einsum("bkd,bsd->bks", hidden, earlier)
    norms = (
        ops.sqrt(ops.sum(hidden * hidden, axis=-1))[:, :, None]
        * ops.sqrt(ops.sum(earlier * earlier, axis=-1))[:, None, :]
    )  # (B, k, S)
    outputs = ops.shape(earlier)[1] - ops.shape(current.prompt)[1]
    written = ops.arange(outputs, dtype="int32") < index  # (T,)
    valid = ops.concatenate(
        [current.prompt, ops.broadcast_to(written[None], (ops.shape(earlier)[0], outputs))],
        axis=1,
    )  # (B, S)
    safe = ops.where(valid[:, None, :], norms, 1.0)
    similarity = ops.where(valid[:, None, :], dots / safe, -1.0)  # -1: the lowest cosine
    return ops.max(similarity, axis=-1)
