"""`keras-attn`: list the tasks, train one (fit, evaluate, save, export, plot), or predict.

    keras-attn list
    keras-attn train TASK [--dataset NAME] [--data-dir DIR] [--epochs N]
                          [--attention additive|none] [--export DIR] [--plot FILE]
                          [--output DIR] ...
    keras-attn predict TASK [TEXT ...] [--runs-dir DIR] [--stream] [--temperature T]
                       [--top-k K] [--top-p P] [--seed S] [--repetition-penalty R]
                       [--no-repeat-ngram-size N] [--max-length L] [--stop TEXT ...]
                       [--min-new-tokens M] [--kv-cache-dtype float|int8]
    keras-attn export transformer-lm --format transformers DIR [--runs-dir DIR]

A command's options may come before, between or after its positional arguments.
The default of every generated task needs no network: its tfds builder
generates the data into `--data-dir`.

Every flag is checked before any work (no data read, no model built): a bad
value, or a flag the task does not take, stops the command with one line
naming the flag and the value, exit status 2.

With `--strategy multi-worker` every worker of `TF_CONFIG` runs the same command;
the chief writes the files, the other workers make the same saves into temporary
directories and delete them (docs/training.md).
"""

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile

# TensorFlow's log lines (device probing, oneDNN, XLA, tf.data notices) are hidden unless
# the user sets TF_CPP_MIN_LOG_LEVEL. TensorFlow reads the level once, when it is
# imported, so this takes effect only where nothing imported TensorFlow before this
# module (see `_quiet_tensorflow`); a program that imported it keeps its own logging.
# The installed command (bin/keras-attn) sets the level itself before importing
# `keras_attn`, and says so with KERAS_ATTN_QUIET.
_QUIET = "TF_CPP_MIN_LOG_LEVEL" not in os.environ or os.environ.get("KERAS_ATTN_QUIET") == "1"
if _QUIET and "tensorflow" not in sys.modules:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

OUTPUT = "keras_attn_runs"
TRAIN_EPILOG = f"""\
outputs (OUTPUT is ./{OUTPUT} unless --output says otherwise):
  OUTPUT/TASK.keras             the trained model, text tasks with their vocabularies (reload
                                it after `import keras_attn.models`)
  OUTPUT/TASK_savedmodel/       a SavedModel for serving, text in and out for text tasks
                                (--export DIR instead; none for a text task trained on
                                another backend than TensorFlow)
  OUTPUT/TASK_attention.png     attention weights of one test example (--plot FILE instead;
                                none for a model without attention)
  OUTPUT/TASK_metrics.json      the test metrics (translation: `bleu`, corpus BLEU of the
                                test split) and the training losses

TensorFlow's own log lines are hidden unless TF_CPP_MIN_LOG_LEVEL is set (e.g. to 0).
"""


class _Parser(argparse.ArgumentParser):
    """`argparse` whose errors are one line (no usage block), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class _Command(_Parser):
    """A command's parser (`train`, `predict`, ...): its options anywhere among its positional
    arguments, e.g. `predict TASK --runs-dir DIR TEXT` (`parse_intermixed_args`; the parser
    of the commands itself cannot intermix, it holds them as a positional argument)."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing:  # the two passes of `parse_known_intermixed_args`
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _integer(text, low, what):
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise argparse.ArgumentTypeError(f"must be {what}. Received: {text!r}")
    return value


def _positive(text):
    return _integer(text, 1, "a positive integer")


def _non_negative(text):
    return _integer(text, 0, "a non-negative integer")


def _size(text):
    """`--n`: `"50"` or a range `"5-50"` (low < high), kept as the string."""
    low, _, high = text.partition("-")
    try:
        bounds = [int(low)] + ([int(high)] if high else [])
    except ValueError:
        bounds = []
    if not bounds or min(bounds) < 1 or (len(bounds) == 2 and bounds[0] >= bounds[1]):
        raise argparse.ArgumentTypeError(
            f"must be a size like 50 or a range LOW-HIGH with LOW < HIGH, e.g. 5-50. "
            f"Received: {text!r}"
        )
    return text


def _sizes(text):
    """`--eval-n`: sizes separated by commas, e.g. `"50,100,200"`, kept as the string."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"must be sizes separated by commas, e.g. 50,100,200. Received: {text!r}"
        )
    return text


def _mesh(text):
    """`--mesh`: `"BATCHxMODEL"`, two positive integers, e.g. `"2x4"`, kept as the string."""
    try:
        sizes = [int(part) for part in text.lower().split("x")]
    except ValueError:
        sizes = []
    if len(sizes) != 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"must be BATCHxMODEL, two positive integers, e.g. 2x4. Received: {text!r}"
        )
    return text


def _version():
    """The installed keras-attn's version, read without importing it (and TensorFlow)."""
    try:
        return importlib.metadata.version("keras-attn")
    except importlib.metadata.PackageNotFoundError:  # a source tree on the path, not installed
        import keras_attn

        return keras_attn.__version__


def _parser():
    parser = _Parser(prog="keras-attn", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Command)
    commands.add_parser("list", help="the tasks, each a zoo model and a dataset, their defaults")
    train = commands.add_parser(
        "train",
        help="train a task, evaluate, save, export, plot",
        description="Train a task (`keras-attn list`), evaluate it, save, export and plot it.",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = train.add_argument
    add("task", help="a task name from `keras-attn list`")
    add("--dataset", help="tfds name (with config) instead of the task's default")
    add("--data-dir", help="tfds data directory (default: tfds' own, ~/tensorflow_datasets)")
    add("--epochs", type=_positive, help="passes over the training data (default: the task's)")
    add(
        "--train-examples",
        type=_positive,
        help="use this many training examples (default: the task's)",
    )
    add(
        "--test-examples",
        type=_positive,
        default=500,
        help="test examples to evaluate on (default: %(default)s)",
    )
    add("--batch-size", type=_positive, default=64, help="(default: %(default)s)")
    add("--download", action="store_true", help="let tfds download a real dataset (network)")
    add("--output", default=OUTPUT, help="where the files go (default: ./%(default)s)")
    add("--export", help="SavedModel directory (default: OUTPUT/TASK_savedmodel)")
    add("--plot", help="attention plot PNG (default: OUTPUT/TASK_attention.png)")
    add("--seed", type=_non_negative, default=0, help="(default: %(default)s)")
    add("--n", type=_size, help="pointer tasks: the training size, 50 or a range 5-50 (default: 5)")
    add(
        "--eval-n", type=_sizes, help="pointer tasks: also evaluate at these sizes, e.g. 50,100,200"
    )
    add(
        "--strategy",
        choices=["mirrored", "multi-worker"],
        help="tf.distribute: all local devices, or the workers named by TF_CONFIG "
        "(default: one device)",
    )
    add(
        "--mesh",
        type=_mesh,
        metavar="BATCHxMODEL",
        help="JAX: model parallel on a device mesh, e.g. 2x4: each batch split over BATCH "
        "devices, each copy of the Transformer's weights over MODEL (heads, feed-forward, "
        "embeddings: keras.distribution.ModelParallel with keras_attn.models.layout_map); "
        "transformer-lm (default: one device)",
    )
    add(
        "--pooling", choices=["attention", "mean"],
        help="imdb tasks: the classifier's pooling (default: attention; mean is the ablation)",
    )  # fmt: skip
    add(
        "--attention", choices=["additive", "none"],
        help="ted-translate, rnn-attention-reverse: the RNN encoder-decoder with additive "
        "(Bahdanau) attention, or the same RNN without attention (default: the task's model)",
    )  # fmt: skip
    add(
        "--baseline", action=argparse.BooleanOptionalAction,
        help="transformer-lm: train and report the LSTM baseline too (default: yes)",
    )  # fmt: skip
    add(
        "--backup-dir",
        help="checkpoint here every epoch; a killed run resumes from it (delete it to start over)",
    )
    predict = commands.add_parser(
        "predict",
        help="a trained text task's output for each text (its last run)",
        description="Load TASK's last run (OUTPUT/TASK.keras) and print one output line per "
        "input text: the decoded text (seq2seq tasks), the continuation (language model) or "
        "the class name (classifiers). Inputs unlike the training data (outside its lengths, "
        "or with words outside the vocabulary) get one warning line per kind on stderr.",
    )
    predict.add_argument("task", help="a text task that `keras-attn train` ran")
    predict.add_argument(
        "text", nargs="*", default=[], help="input texts (none: one per line of standard input)"
    )
    predict.add_argument(
        "--runs-dir",
        default=OUTPUT,
        help="the run's directory, train's --output (default: ./%(default)s)",
    )
    predict.add_argument(
        "--stream", action="store_true",
        help="transformer-lm: print the words as they are generated (each text continued "
        "alone: sampled with --seed, the draws of a batch of one)",
    )  # fmt: skip
    predict.add_argument(
        "--temperature", type=float,
        help="transformer-lm: sample at this temperature (0: greedy; default: greedy, or 1 "
        "with --top-k, --top-p or --seed)",
    )  # fmt: skip
    predict.add_argument("--top-k", type=int, help="transformer-lm: sample among the k likeliest")
    predict.add_argument("--top-p", type=float, help="transformer-lm: the nucleus mass, in (0, 1]")
    predict.add_argument("--seed", type=int, help="transformer-lm: the sampling seed")
    predict.add_argument(
        "--repetition-penalty", type=float,
        help="transformer-lm: CTRL's penalty on the tokens already in the text (> 1 "
        "discourages repeats; 1: off)",
    )  # fmt: skip
    predict.add_argument(
        "--no-repeat-ngram-size", type=int,
        help="transformer-lm: never repeat an n-gram of this many tokens (0: off)",
    )  # fmt: skip
    predict.add_argument(
        "--max-length", type=int,
        help="transformer-lm: the most new tokens (default and largest: the run's)",
    )  # fmt: skip
    predict.add_argument(
        "--kv-cache-dtype", choices=["float", "int8"],
        help="transformer-lm: the KV cache's keys and values in the model's dtype (float, "
        "the default) or int8 with a scale per position and head",
    )  # fmt: skip
    predict.add_argument(
        "--stop", action="append", metavar="TEXT",
        help="transformer-lm: a stop string (repeat the flag for more): a text ends after "
        "the first one it generates (kept); its words must be in the run's vocabulary",
    )  # fmt: skip
    predict.add_argument(
        "--min-new-tokens", type=int,
        help="transformer-lm: the end token and the stop strings' completion ruled out "
        "until a text has this many new tokens (0: off)",
    )  # fmt: skip
    export = commands.add_parser(
        "export",
        help="a trained language model as a Hugging Face folder",
        description="Write TASK's last run (a language model) as a Hugging Face checkpoint "
        "folder (config.json, model.safetensors, generation_config.json, tokenizer.json): "
        "transformers' text-generation pipeline, vLLM, SGLang and TGI load it.",
    )
    export.add_argument("task", help="a language model task that `keras-attn train` ran")
    export.add_argument("directory", help="the folder to write")
    export.add_argument("--format", choices=["transformers"], required=True)
    export.add_argument(
        "--runs-dir", default=OUTPUT, help="train's --output (default: ./%(default)s)"
    )
    return parser


def _export(args):
    """`keras-attn export`: the folder written, or exit status 1 naming what is missing."""
    from . import text
    from .checkpoints import to_transformers

    try:
        model = text.load_run(args.task, args.runs_dir, _text_tasks())
        if not isinstance(model, text.TextLanguageModel):
            raise ValueError(f"{args.task!r} is not a language model task (transformer-lm)")
        to_transformers(model, args.directory)
    except (FileNotFoundError, ValueError) as error:
        print(f"keras-attn export: error: {error}", file=sys.stderr)
        return 1
    print(args.directory)
    return 0


_SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "seed")
_GENERATION_FLAGS = (*_SAMPLING_FLAGS, "repetition_penalty", "no_repeat_ngram_size", "max_length")
_GENERATION_FLAGS += ("min_new_tokens", "stop", "kv_cache_dtype")


def _generation(args):
    """`predict`'s generation settings from its flags: `config` (a `GenerationConfig`, greedy
    unless a sampling flag is given) where a setting's flag is given, and `max_length` where
    given; `{}` for none. `ValueError` naming the flag for a bad value."""
    from .generation import GenerationConfig
    from .generation.config import check_setting

    given = {name: getattr(args, name) for name in _GENERATION_FLAGS}
    generation, settings = {}, {}
    try:
        if any(given[name] is not None for name in _SAMPLING_FLAGS):
            temperature = 1.0 if given["temperature"] is None else given["temperature"]
            settings.update(
                sampler="sample", temperature=temperature, top_k=given["top_k"],
                top_p=given["top_p"], seed=given["seed"],
            )  # fmt: skip
        for name in ("repetition_penalty", "no_repeat_ngram_size", "min_new_tokens",
                     "kv_cache_dtype"):  # fmt: skip
            if given[name] is not None:
                settings[name] = given[name]
        if given["stop"] is not None:  # spelled with the run's vocabulary once loaded
            generation["stop"] = given["stop"]
        if settings:
            generation["config"] = GenerationConfig(**settings)
        if given["max_length"] is not None:  # the run's own bound: checked once loaded
            generation["max_length"] = check_setting("max_length", given["max_length"])
    except ValueError as error:  # name the flag, not the argument
        message = str(error)
        for name in _GENERATION_FLAGS:
            message = message.replace(f"`{name}`", f"--{name.replace('_', '-')}")
        raise ValueError(message) from None
    return generation


def _text_tasks():
    """`{task: whether it is a text task}` of `keras-attn train`; None where the recipes
    cannot be imported (they need tensorflow-datasets, which loading a run does not)."""
    try:
        from . import recipes
    except ImportError:
        return None
    return {name: run.text for name, (_, run) in recipes.TASKS.items()}


def _predict(args):
    """`keras-attn predict`: one line per input, in order; exit status 1 without a run."""
    from . import text

    try:
        generation = _generation(args)
    except ValueError as error:
        print(f"keras-attn predict: error: {error}", file=sys.stderr)
        return 2
    texts = args.text if args.text else [line.rstrip("\n") for line in sys.stdin]
    try:
        model = text.load_run(args.task, args.runs_dir, _text_tasks())
    except (FileNotFoundError, ValueError) as error:
        print(f"keras-attn predict: error: {error}", file=sys.stderr)
        return 1
    if (generation or args.stream) and not isinstance(model, text.TextLanguageModel):
        flag = (
            "--stream"
            if args.stream
            else ", ".join(f"--{name.replace('_', '-')}" for name in _GENERATION_FLAGS)
        )
        print(
            f"keras-attn predict: error: {flag}: only a language model's task (transformer-lm) "
            f"takes generation settings or streams. Received: task={args.task!r}",
            file=sys.stderr,
        )
        return 2

    for sentence in model.outside_training(texts):  # once per run, each kind
        print(
            f"keras-attn predict: warning: {sentence}: the outputs of such inputs may be "
            "meaningless",
            file=sys.stderr,
        )
    try:
        if args.stream:
            for one in texts:  # each input's words as they come, then its line's end
                words = (w for (w,) in model.stream_text([one], **generation) if w)
                for i, word in enumerate(words):
                    print(f"{' ' if i else ''}{word}", end="", flush=True)
                print()
            return 0
        for output in model.predict_text(texts, **generation):  # (settings: a language model's)
            print(output)
    except ValueError as error:  # --max-length past the run's, a --stop it cannot spell:
        # checked before any output
        message = str(error).replace("`max_length`", "--max-length").replace("`stop`", "--stop")
        print(f"keras-attn predict: error: {message}", file=sys.stderr)
        return 2
    return 0


def _quiet_tensorflow():
    """Starts TensorFlow without its notices, unless the user set TF_CPP_MIN_LOG_LEVEL.

    TensorFlow prints device and oneDNN notices while it loads, before its logging
    starts (so whatever the level): the file descriptor of stderr points at /dev/null
    for the import only, and an import error still shows its traceback. Then the
    Python-side notices of TensorFlow and tfds (absl) are hidden too.
    """
    if not _QUIET:
        return
    if "tensorflow" not in sys.modules:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), 2)
                import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    import absl.logging
    import tensorflow as tf

    absl.logging.set_verbosity(absl.logging.ERROR)  # tfds' notices go through absl
    tf.get_logger().setLevel("ERROR")
    try:
        import tensorflow_datasets as tfds
    except ImportError:  # the task will say what it needs
        return
    tfds.disable_progress_bar()  # its bars while it generates a dataset, the first time


def _flag_error(args, recipes):
    """The first flag of `args` that `args.task` does not take or whose value it cannot use."""
    if args.task not in recipes.TASKS:
        return f"unknown task {args.task!r}; see `keras-attn list`"
    run = recipes.TASKS[args.task][1]
    for flag in ("n", "eval_n", "pooling", "attention", "baseline", "mesh"):
        value = getattr(args, flag)
        if value is not None and flag not in run.options:
            takes = [t for t, (_, r) in recipes.TASKS.items() if flag in r.options]
            return (
                f"argument --{flag.replace('_', '-')}: does not apply to {args.task} "
                f"(only to {', '.join(takes)}). Received: {value!r}"
            )
    if args.n is not None and args.dataset is not None:
        return f"argument --n: --dataset already names the training set. Received: {args.n!r}"
    if args.strategy == "multi-worker" and not os.environ.get("TF_CONFIG"):
        return "argument --strategy: multi-worker needs TF_CONFIG. Received: 'multi-worker'"
    if args.mesh is not None:
        error = (
            "--strategy is TensorFlow's data parallel, --mesh JAX's model parallel: one or "
            "the other"
            if args.strategy
            else recipes.mesh_error(_mesh_shape(args.mesh))
        )
        if error:
            return f"argument --mesh: {error}. Received: {args.mesh!r}"
    dataset = args.dataset or getattr(run, "default_dataset", None)
    if args.dataset is not None:
        error = recipes.dataset_error(args.dataset)
        if error:
            return f"argument --dataset: {error}. Received: {args.dataset!r}"
    sizes = [("--n", args.n, args.n)] if args.n else []
    sizes += [("--eval-n", args.eval_n, n) for n in (args.eval_n or "").split(",") if n]
    for flag, text, size in sizes:  # each needs a config of the builder: ".../n50"
        try:
            recipes.pointer.sized_dataset(dataset, size)
        except ValueError as error:
            return f"argument {flag}: {error}. Received: {text!r}"
    return None


def _mesh_shape(text):
    """`--mesh`'s `"2x4"` as `Settings.mesh`, `(2, 4)`."""
    batch, model = text.lower().split("x")
    return int(batch), int(model)


def main(argv=None):
    """Runs the command line; returns the process exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    _quiet_tensorflow()
    if args.command == "predict":
        return _predict(args)
    if args.command == "export":
        return _export(args)
    from . import recipes  # imports TensorFlow: after argument parsing
    from .files import write_atomically

    if args.command == "list":
        width = max(map(len, recipes.TASKS))
        for name, (description, run) in recipes.TASKS.items():
            print(f"{name:<{width}}  {description}; {recipes.defaults(run)}")
        return 0
    error = _flag_error(args, recipes)
    if error:
        print(f"keras-attn train: error: {error}", file=sys.stderr)
        return 2
    settings = recipes.Settings(
        dataset=args.dataset,
        data_dir=args.data_dir,
        epochs=args.epochs,
        train_examples=args.train_examples,
        test_examples=args.test_examples,
        batch_size=args.batch_size,
        download=args.download,
        seed=args.seed,
        n=args.n,
        eval_n=args.eval_n,
        strategy=args.strategy,
        mesh=None if args.mesh is None else _mesh_shape(args.mesh),
        backup_dir=args.backup_dir,
        pooling=args.pooling,
        attention=args.attention,
        baseline=args.baseline,
    )
    try:
        result = recipes.train(args.task, settings)
    except FileNotFoundError as error:
        print(f"keras-attn: {error}", file=sys.stderr)
        return 1
    if not recipes.writes_files(result.model):  # a non-chief worker: the same saves, discarded
        with tempfile.TemporaryDirectory() as scratch:
            (result.text_model or result.model).save(os.path.join(scratch, "model.keras"))
            result.export(os.path.join(scratch, "savedmodel"))
        print(f"trained {args.task} on {result.dataset} (a worker: the chief writes the files)")
        return 0
    os.makedirs(args.output, exist_ok=True)
    stem = os.path.join(args.output, args.task)
    paths = {
        "keras": f"{stem}.keras",
        "savedmodel": args.export or f"{stem}_savedmodel",
        "plot": args.plot or f"{stem}_attention.png",
        "metrics": f"{stem}_metrics.json",
    }
    # Written next to their paths and renamed into place: a kill leaves no half files.
    write_atomically(paths["keras"], (result.text_model or result.model).save)
    if result.export is None:  # a text model trained on another backend than TensorFlow
        del paths["savedmodel"]
    else:
        write_atomically(paths["savedmodel"], result.export)
    if result.plot is None:  # a model without attention weights
        del paths["plot"]
    else:
        result.plot(paths["plot"])
    history = getattr(result.model, "history", None)  # Keras' `History` of the last `fit`
    losses = {"loss": history.history.get("loss", [])} if history else {}
    with open(paths["metrics"], "w") as f:
        header = {"task": args.task, "dataset": result.dataset}
        if args.attention:
            header["attention"] = args.attention
        json.dump({**header, **result.metrics, **losses}, f, indent=1)
    print(f"trained {args.task} on {result.dataset}")
    for metric, value in result.metrics.items():  # lists (losses, samples): in the JSON only
        if isinstance(value, float):
            print(f"  {metric}: {value:.4f}")
        elif isinstance(value, int | str):
            print(f"  {metric}: {value}")
    print("wrote")
    for what, path in paths.items():
        print(f"  {what}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
