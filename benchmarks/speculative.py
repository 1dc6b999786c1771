"""Speculative decoding against plain decoding of the target: tokens per second, acceptance.

    KERAS_BACKEND=tensorflow python -m benchmarks.speculative --gpt2-small [--quick]
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.speculative --gpt2-small [--quick]
    python -m benchmarks.speculative --trained TARGET.keras DRAFT.keras
    python -m benchmarks.speculative --train-draft RUNS_DIR --draft-width 16 --data-dir DIR

Greedy decoding, `keras_attn.models.generate(target, prompts, new)` against
`generate(target, prompts, new, draft_model=draft, num_speculative_tokens=k)`, both
compiled as `generate` compiles by default (one `tf.function(jit_compile=True)` / `jax.jit`
of the whole loop), in one process, repeats interleaved (`benchmarks.timing.time_group`);
the speed-up is the median per-repeat ratio plain / speculative of the call times (> 1:
speculative is faster), [min-max]. Both give the same tokens (checked). Acceptance: the
draft's proposals the rule accepted over those it made, and the new tokens per target
step (the loop's `SpeculativeStats`).

`--gpt2-small`: a target of GPT-2 small's size with random weights (12 layers, 12 heads,
hidden 768, intermediate 3,072, vocabulary 50,257: 124 M weights), a 32-token random
prompt, batch 1, and two drafts: `small`, its own random weights (2 layers, 4 heads, hidden
256, intermediate 1,024: 14.5 M weights, 1/8.6 of the target; random weights agree little),
and `first 2 blocks`: the target cut after its first 2 of 12 blocks (its embeddings, 2
blocks and final norm copied: 53.6 M weights, 0.43 of the target's, most of it the
50,257 x 768 embedding every step reads for its logits: larger than the 1/4-1/10 a draft
should be, shown because it agrees with the target where a random draft cannot).

`--trained TARGET DRAFT`: two `TextLanguageModel` runs of `keras-attn train transformer-lm`
(the same data and vocabulary), the recipe's prompts continued (its `max_length`, its
`end_id` and `suppress_ids`), batch 1 each prompt. `--train-draft RUNS_DIR` makes a draft:
the recipe (`keras-attn train transformer-lm --no-baseline`) with one block of
`--draft-width` (`d_model`; 2 heads, feed-forward 4x), into `RUNS_DIR/transformer-lm.keras`.
"""

import argparse
import json

import keras
import numpy as np

from benchmarks.timing import loadavg, time_group
from keras_attn.models import generate, transformer_lm

GPT2_SMALL = dict(num_layers=12, num_heads=12, d_model=768, intermediate_dim=3072)
SMALL_DRAFT = dict(num_layers=2, num_heads=4, d_model=256, intermediate_dim=1024)
VOCAB, PROMPT, NEW, K = 50257, 32, 64, 4


def truncated(target, **options):
    """`target`'s first `options["num_layers"]` blocks (and embeddings, final norm): a draft."""
    draft = transformer_lm(VOCAB, **options)
    for layer in draft.layers:
        if layer.weights:
            layer.set_weights(target.get_layer(layer.name).get_weights())
    return draft


def compare(target, drafts, prompts, new, k, repeats, **settings):
    """One row per draft: tokens/s plain and speculative, speed-up, acceptance."""
    rows = []
    plain = lambda p: generate(target, p, new, **settings)  # noqa: E731
    reference = plain(prompts)
    for label, draft in drafts.items():

        def speculative(p, draft=draft):
            return generate(target, p, new, draft_model=draft, num_speculative_tokens=k,
                            **settings)  # fmt: skip

        tokens, stats = generate(target, prompts, new, draft_model=draft,
                                 num_speculative_tokens=k, return_acceptance=True,
                                 **settings)  # fmt: skip
        same = bool(np.array_equal(tokens, reference))
        timed = time_group({"speculative": speculative, "plain": plain}, (prompts,),
                           repeats=repeats, min_time=0.0, max_calls=1)  # fmt: skip
        count = int(np.sum(reference != 0))  # the tokens made (a row ends at its `end_id`)
        row = {
            "draft": label,
            "draft_weights": draft.count_params(),
            "target_weights": target.count_params(),
            "k": k,
            "plain_tokens_per_s": count / timed["plain"]["median_s"],
            "speculative_tokens_per_s": count / timed["speculative"]["median_s"],
            "speedup": timed["ratio"]["plain"],
            "acceptance_rate": stats.acceptance_rate,
            "tokens_per_round": stats.tokens_per_round,
            "same_tokens": same,
        }
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(row):
    s = row["speedup"]
    return (
        f"| {row['draft']} ({row['draft_weights'] / 1e6:.2f} M of {row['target_weights'] / 1e6:.2f}"
        f" M) | {row['k']} | {row['plain_tokens_per_s']:.1f} | "
        f"{row['speculative_tokens_per_s']:.1f} | {s['median']:.2f} "
        f"[{s['min']:.2f}-{s['max']:.2f}] | {row['acceptance_rate']:.2f} | "
        f"{row['tokens_per_round']:.2f} | {row['same_tokens']} |"
    )


def gpt2_small(quick):
    keras.utils.set_random_seed(0)
    target = transformer_lm(VOCAB, dropout=0.0, **GPT2_SMALL)
    keras.utils.set_random_seed(1)
    drafts = {
        "small": transformer_lm(VOCAB, dropout=0.0, **SMALL_DRAFT),
        "first 2 blocks": truncated(target, dropout=0.0, **{**GPT2_SMALL, "num_layers": 2}),
    }
    prompts = np.random.default_rng(0).integers(1, VOCAB, (1, PROMPT)).astype("int32")
    new = NEW // 2 if quick else NEW
    return compare(target, drafts, prompts, new, K, 3 if quick else 5)


def smoke():
    """The rows on tiny models (the benchmark's test): a random draft, the target itself."""
    keras.utils.set_random_seed(0)
    target = transformer_lm(100, num_layers=2, d_model=16, intermediate_dim=32, dropout=0.0)
    draft = transformer_lm(100, num_layers=1, d_model=8, intermediate_dim=16, dropout=0.0)
    prompts = np.random.default_rng(0).integers(1, 100, (1, 8)).astype("int32")
    return compare(target, {"small": draft, "the target": target}, prompts, 8, 2, 2)


def trained(target_path, draft_path, quick):
    target_text = keras.saving.load_model(target_path, safe_mode=True)
    draft_text = keras.saving.load_model(draft_path, safe_mode=True)
    if target_text.lookup.get_vocabulary() != draft_text.lookup.get_vocabulary():
        raise ValueError("The two runs' vocabularies differ: train them on the same data.")
    from keras_attn.models.recipes.language_model import PROMPTS

    rows = []
    for prompt in PROMPTS:
        ids = np.asarray(target_text.prompt_ids(np.array([prompt])))
        rows += compare(
            target_text.language_model, {f"trained draft, {prompt!r}": draft_text.language_model},
            ids, target_text.max_length, K, 3 if quick else 5,
            end_id=target_text.end_id, suppress_ids=target_text.suppress_ids,
        )  # fmt: skip
    return rows


def train_draft(runs_dir, width, data_dir=None):
    """The `transformer-lm` recipe with a one-block model of `d_model=width`."""
    from keras_attn.models import cli
    from keras_attn.models.recipes import language_model

    language_model.TRANSFORMER = dict(
        num_layers=1, num_heads=2, d_model=width, intermediate_dim=4 * width
    )
    data = ["--data-dir", data_dir] if data_dir else []
    return cli.main(["train", "transformer-lm", "--no-baseline", "--output", runs_dir, *data])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpt2-small", action="store_true", help="random GPT-2-small target")
    parser.add_argument("--trained", nargs=2, metavar=("TARGET", "DRAFT"),
                        help="two `keras-attn train transformer-lm` runs (.keras)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="3 repeats, half the tokens")
    parser.add_argument("--smoke", action="store_true", help="tiny models, 2 repeats")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--train-draft", metavar="RUNS_DIR", help="train a draft (see above)")
    parser.add_argument("--draft-width", type=int, default=16, help="the draft's d_model")
    parser.add_argument("--data-dir", help="--train-draft: the recipe's --data-dir")
    args = parser.parse_args(argv)
    if args.train_draft:
        return train_draft(args.train_draft, args.draft_width, args.data_dir)
    print(f"backend {keras.backend.backend()}, load average before {loadavg()}")
    print("| draft (weights) | k | plain tok/s | speculative tok/s | speed-up | acceptance "
          "| tokens/round | same tokens |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    rows = []
    if args.smoke:
        rows += smoke()
    if args.gpt2_small:
        rows += gpt2_small(args.quick)
    if args.trained:
        rows += trained(*args.trained, args.quick)
    print(f"load average after {loadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": keras.backend.backend(), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
