"""Corpus BLEU of decoded text, computed by keras-hub's `keras_hub.metrics.Bleu`.

    BLEU = BP * exp(sum_n 1/N log p_n),  BP = min(1, exp(1 - r / c))

`p_n` is the clipped n-gram precision over the whole corpus (matches of each n-gram
counted at most as often as the reference has it), `c` the words of all hypotheses,
`r` the words of all references, `N = 4`, no smoothing (Papineni et al. 2002).
Both sides are split with sacrebleu's default `13a` tokenizer (punctuation apart),
so the texts are compared as a person writes them, not as a model's tokens.
"""

from collections.abc import Sequence


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], max_order: int = 4) -> float:
    """Corpus BLEU of `hypotheses` against one reference each, in points (0-100).

    The scale of sacrebleu and of the papers: 100 * keras-hub's `Bleu`. Without
    smoothing an order with no match anywhere gives 0, and so do empty hypotheses.

    Args:
        hypotheses: decoded texts, detokenized (words separated by spaces).
        references: the reference texts, one per hypothesis.
        max_order: the longest n-gram counted.

    Returns:
        A Python float in [0, 100].

    Example:

    >>> corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    100.0

    Reference:
        Papineni et al., 2002, "BLEU: a Method for Automatic Evaluation of Machine
        Translation", https://aclanthology.org/P02-1040/
    """
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(
            "`hypotheses` and `references` must be non-empty and of the same length. "
            f"Received: {len(hypotheses)} hypotheses and {len(references)} references"
        )
    for name, texts in (("hypotheses", hypotheses), ("references", references)):
        if not all(isinstance(t, str) for t in texts):
            kinds = sorted({type(t).__name__ for t in texts})
            raise TypeError(f"`{name}` must be strings. Received: {', '.join(kinds)}")
    if not any(h.strip() for h in hypotheses):  # keras-hub would divide by a length of 0
        return 0.0
    try:
        import keras_hub
    except ImportError as error:
        raise ImportError(
            "BLEU is computed by keras-hub: `pip install keras-hub` (or keras-attn's "
            "`examples` extra)."
        ) from error
    metric = keras_hub.metrics.Bleu(max_order=max_order)
    metric.update_state([[r] for r in references], hypotheses)  # (B, 1 reference), (B,)
    return 100.0 * float(metric.result())
