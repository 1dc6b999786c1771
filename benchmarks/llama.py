"""A Llama checkpoint of transformers' own: ours vs keras-hub vs transformers (issue 58).

    KERAS_BACKEND=tensorflow|jax|torch python -m benchmarks.llama [--quick] [--json PATH]
        [--folder DIR] [--no-compile] [--no-transformers] [--smoke]

A Llama-style model (`LLAMA`: hidden 768, 12 layers, 12 heads, 4 key/value
heads, intermediate 2,048, vocabulary 32,000, tied embeddings: 100.1 M
weights, 0.4 GB in float32) with random weights that `transformers` itself
makes (`LlamaConfig` + `LlamaForCausalLM`, `torch.manual_seed(0)`, its own
initialization with `initializer_range=0.2`: at its default 0.02 the logits
are so flat that every row greedily repeats one token, and the check that the
libraries generate the same tokens would check little) and saves
(`save_pretrained`, float32 safetensors) to a folder (`--folder`, by default
under /tmp; made once, reused while its config.json matches; nothing is
downloaded). The one folder is then loaded:

- ours: `keras_attn.models.from_transformers(folder)`;
- keras-hub: `keras_hub.models.LlamaCausalLM.from_preset(folder,
  preprocessor=None)`. keras-hub reads a local folder with a Hugging Face
  config.json through its transformers converters (`get_preset_loader`: a
  `model_type` in config.json; `model_type="llama"` goes to
  `convert_llama3`, so the task is its `Llama3CausalLM`, a `LlamaCausalLM`
  subclass with the same `generate`); `preprocessor=None` because the folder
  has no tokenizer (the model is fed token ids);
- transformers (torch): `AutoModelForCausalLM.from_pretrained(folder)`,
  eager, and with `torch.compile` of its forward (a static KV cache, so the
  compiled step keeps its shapes; unless `--no-compile`), and eager again with
  `torch.set_num_threads(1)` for the call (torch's default here is one thread
  per core: on this shared 2-core machine, busy with other processes, its
  threads waiting on each other made it several times slower than one thread).

Greedy, prompts of 32 random token ids, 64 new tokens (16 with `--quick`),
batch 1 and 8; each library compiled as it does by default:
`keras_attn.models.generate` against keras-hub's `generate` on
`{"token_ids", "padding_mask"}` (its compiled `generate_step`) and
transformers' `generate(ids, max_new_tokens=..., do_sample=False)`. In one
process, repeats interleaved (`benchmarks.timing.time_group`): tokens/s and
the speed ratio ours / each peer (> 1: ours is faster), median [min-max]
over the repeats. Every row checks that each peer generated ours' tokens.
As in `benchmarks.generation --gpt2-small`, each row also gives the bytes a
decoding step reads (`decode_bytes`: every weight once, the KV cache) times
the steps per second of the whole call (the prefill included), against
the NumPy copy bandwidth measured in the same run
(`benchmarks.timing.copy_bandwidth`).

Load time and peak memory: each library loads the folder in a fresh
subprocess (`--load NAME`; the same backend), so the libraries share no
memory: the seconds of the load (`from_transformers`, `from_preset`,
`from_pretrained`) and of a first `generate` after it (batch 1, 4 tokens:
the compilation, and the first read of weights that transformers maps from
the file without reading them at load), and the process' resident-set
high-water mark (`VmHWM`) after the imports, after the load and after that
first `generate`.

With `--smoke`, a tiny Llama (`TINY`), 4 new tokens, one repeat, neither
`torch.compile` nor the one-thread row: the code path of the tests.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402

# `transformers.LlamaConfig` arguments.
LLAMA = dict(
    vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    num_key_value_heads=4, intermediate_size=2048, tie_word_embeddings=True,
    max_position_embeddings=2048, initializer_range=0.2,
)  # fmt: skip
TINY = dict(
    vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True,
    max_position_embeddings=128, initializer_range=0.2,
)  # fmt: skip
PROMPT, NEW, QUICK_NEW, SMOKE_NEW = 32, 64, 16, 4
BATCHES = (1, 8)
LIBRARIES = ("ours", "keras-hub", "transformers")


def make_folder(folder, size, seed=0):
    """Writes a random `LlamaForCausalLM` of `size` to `folder` with `save_pretrained`.

    `torch.manual_seed(seed)` and transformers' own initialization, float32. A
    folder whose config.json already has these sizes is kept as it is.

    Args:
        folder: where to write (created).
        size: `transformers.LlamaConfig` arguments (`LLAMA`, `TINY`).
        seed: torch's seed.

    Returns:
        `folder`.
    """
    config_path = os.path.join(folder, "config.json")
    if os.path.exists(config_path) and os.path.exists(os.path.join(folder, "model.safetensors")):
        with open(config_path) as f:
            config = json.load(f)
        if all(config.get(k) == v for k, v in size.items()):
            return folder
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**size, dtype="float32"))
    model.save_pretrained(folder)
    return folder


def default_folder(size):
    """A cache folder under the temporary directory, named by `size`."""
    key = hashlib.sha1(json.dumps(size, sort_keys=True).encode()).hexdigest()[:10]
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"keras-attn-llama-bench-{key}")


def weight_count(size):
    """The weights of a Llama of `size` (`LlamaConfig` arguments)."""
    d, inner, layers = size["hidden_size"], size["intermediate_size"], size["num_hidden_layers"]
    kv = d // size["num_attention_heads"] * size["num_key_value_heads"]
    block = 2 * d * d + 2 * d * kv + 3 * d * inner + 2 * d  # q, o; k, v; gate, up, down; 2 norms
    tables = (1 if size["tie_word_embeddings"] else 2) * size["vocab_size"] * d
    return layers * block + tables + d  # + the final norm


def decode_bytes(size, batch, cache_length, itemsize=4):
    """Bytes one decoding step of a Llama of `size` must read from memory.

    Every weight once (`weight_count`; of an untied token table the step looks up `batch`
    rows, of a tied one the output projection reads all of it), and the KV cache: keys and
    values of every block at `cache_length` positions, `num_key_value_heads x head_dim`
    wide (grouped-query attention keeps fewer heads of keys and values). Activations,
    the logits written and the cache's one new position are left out.

    Args:
        size: `LlamaConfig` arguments.
        batch: sequences decoded at once.
        cache_length: positions a step attends to (a mean:
            `benchmarks.generation.mean_cache_length`).
        itemsize: bytes per value (4: float32).

    Returns:
        Bytes, a float.
    """
    d = size["hidden_size"]
    weights = weight_count(size)
    if not size["tie_word_embeddings"]:  # the lookup reads `batch` rows of its own table
        weights += batch * d - size["vocab_size"] * d
    kv = d // size["num_attention_heads"] * size["num_key_value_heads"]
    cache = 2 * size["num_hidden_layers"] * batch * cache_length * kv
    return float(weights + cache) * itemsize


def memory_kib():
    """`{"hwm_kib", "rss_kib"}`: this process' resident-set high-water mark and current size."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                fields[name] = int(value.split()[0])
    return {"hwm_kib": fields["VmHWM"], "rss_kib": fields["VmRSS"]}


def load(library, folder):
    """Loads `folder` in `library` (a name of `LIBRARIES`); returns the model and the seconds."""
    start = time.perf_counter()
    if library == "ours":
        from keras_attn.models import from_transformers

        model = from_transformers(folder)
    elif library == "keras-hub":
        import keras_hub

        model = keras_hub.models.LlamaCausalLM.from_preset(folder, preprocessor=None)
    elif library == "transformers":
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    else:
        raise ValueError(f"`library` must be one of {LIBRARIES}. Received: library={library!r}")
    return model, time.perf_counter() - start


def load_report(library, folder, vocab):
    """Load time and the RSS high-water mark before and after loading (this process).

    Imports the library's modules first (the backend, keras-hub or transformers), so that
    `before` is the process with its imports and `after - before` what the load adds; then
    a first `generate` (batch 1, `SMOKE_NEW` tokens after `PROMPT`: the compilation, and
    the first read of weights that a library maps from the file without reading them),
    `ready` the high-water mark after it.
    """
    if library == "transformers":
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401
    else:
        import keras  # noqa: F401

        from keras_attn.models import from_transformers  # noqa: F401

        if library == "keras-hub":
            import keras_hub  # noqa: F401
    before = memory_kib()
    model, seconds = load(library, folder)
    after = memory_kib()
    run = generators({library: model}, 1, PROMPT, SMOKE_NEW, vocab)[library]
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    return {
        "library": library, "load_s": seconds, "first_generate_s": first,
        "before": before, "after": after, "ready": memory_kib(),
    }  # fmt: skip


def fresh_load(library, folder):
    """`load_report` in a fresh subprocess of this module (the same backend)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    command = [sys.executable, "-m", "benchmarks.llama", "--load", library, "--folder", folder]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def generators(models, batch, prompt_length, new, vocab):
    """`{name: fn}`: each `fn()` returns the `(batch, new)` greedy tokens of its library.

    `models`: `{"ours", "keras-hub", "transformers", "transformers 1 thread",
    "transformers compiled"}` (any of them), the loaded models; "transformers 1 thread"
    runs its model with `torch.set_num_threads(1)` for the call.
    """
    prompts = np.random.default_rng(1).integers(0, vocab, (batch, prompt_length)).astype("int32")
    fns = {}
    if "ours" in models:
        from keras_attn.models import generate

        fns["ours"] = lambda: np.asarray(generate(models["ours"], prompts, new))
    if "keras-hub" in models:
        hub = models["keras-hub"]
        hub.compile(sampler="greedy")
        inputs = {
            "token_ids": np.concatenate([prompts, np.zeros((batch, new), "int32")], 1),
            "padding_mask": np.arange(prompt_length + new)[None].repeat(batch, 0) < prompt_length,
        }
        fns["keras-hub"] = lambda: np.asarray(
            hub.generate(inputs, stop_token_ids=None)["token_ids"]
        )[:, prompt_length:]
    for name in ("transformers", "transformers 1 thread", "transformers compiled"):
        if name in models:
            fns[name] = _hf_generator(models[name], prompts, new, 1 if "thread" in name else None)
    return fns


def _hf_generator(model, prompts, new, threads=None):
    import torch

    ids = torch.tensor(prompts, dtype=torch.long)
    mask = torch.ones_like(ids)

    def run():
        if threads is not None:
            default = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                return _hf_generator(model, prompts, new)()
            finally:
                torch.set_num_threads(default)
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        return out[:, prompts.shape[1] :].numpy()

    return run


def compiled_transformers(model):
    """The model with its forward under `torch.compile` and a static KV cache (transformers'
    own recipe for a compiled `generate`: the step keeps its shapes, so it compiles once per
    batch size). A copy: `model` stays eager."""
    import copy

    import torch

    compiled = copy.deepcopy(model)
    compiled.generation_config.cache_implementation = "static"
    compiled.forward = torch.compile(compiled.forward)
    return compiled


def compare(models, size, new, repeats, bandwidth):
    """Every library of `models` for each batch of `BATCHES`; prints the table, returns rows."""
    from benchmarks import timing
    from benchmarks.generation import mean_cache_length

    peers = [name for name in models if name != "ours"]
    head = "| B | prompt + new | " + " | ".join(f"{n} tok/s" for n in ["ours", *peers])
    head += " | " + " | ".join(f"ours/{n}" for n in peers) + " | same tokens | MB/step |"
    head += " ours GB/s (% copy) |"
    print(head)
    print("|---" * head.count(" |") + "|", flush=True)
    rows = []
    for batch in BATCHES:
        fns = generators(models, batch, PROMPT, new, size["vocab_size"])
        errors = {}
        for name in list(fns):  # a peer that fails (torch.compile, say) is recorded, not fatal
            try:
                fns[name]()
            except Exception as error:  # noqa: BLE001
                if name == "ours":
                    raise
                errors[name] = f"{type(error).__name__}: {str(error)[:300]}"
                del fns[name]
        tokens = {name: fn() for name, fn in fns.items()}
        same = {n: bool(np.array_equal(tokens["ours"], tokens[n])) for n in fns if n != "ours"}
        same_rows = {
            n: [bool(np.array_equal(a, b)) for a, b in zip(tokens["ours"], tokens[n], strict=True)]
            for n in same
        }
        result = timing.time_group(fns, (), repeats=repeats, min_time=0.0, max_calls=1)
        count = batch * new
        speed = {n: count / result[n]["median_s"] for n in fns}
        step = decode_bytes(size, batch, mean_cache_length(PROMPT, 1, new))
        gbps = step * speed["ours"] / batch / 1e9
        row = {
            "batch": batch, "prompt": PROMPT, "new": new, "tokens_per_s": speed,
            "ratio": {n: result["ratio"][n] for n in same}, "same_tokens": same,
            "same_tokens_per_row": same_rows, "errors": errors, "timing": result,
            "bytes": {"per_step": step, "ours_gbps": gbps,
                      "ours_pct_bandwidth": 100 * gbps / bandwidth["gbps"]},
        }  # fmt: skip
        rows.append(row)
        cells = [f"{speed[n]:.1f}" if n in speed else "failed" for n in ["ours", *peers]]
        for n in peers:
            r = row["ratio"].get(n)
            cells.append(f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]" if r else "-")
        cells.append(", ".join(f"{n}: {same[n]}" for n in same))
        cells.append(f"{step / 1e6:.0f}")
        cells.append(f"{gbps:.1f} ({row['bytes']['ours_pct_bandwidth']:.0f}%)")
        print(f"| {batch} | {PROMPT} + {new} | " + " | ".join(cells) + " |", flush=True)
        for name, error in errors.items():
            print(f"  {name} failed: {error}", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, 16 new tokens")
    parser.add_argument("--smoke", action="store_true", help="a tiny Llama, 4 new tokens")
    parser.add_argument("--json", help="write every sample to this file")
    parser.add_argument("--folder", help="the checkpoint folder (made if missing)")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile row")
    parser.add_argument(
        "--no-transformers", action="store_true", help="ours and keras-hub only (no torch rows)"
    )
    parser.add_argument("--load", choices=LIBRARIES, help=argparse.SUPPRESS)  # a subprocess
    args = parser.parse_args(argv)
    size = TINY if args.smoke else LLAMA
    folder = args.folder or default_folder(size)
    if args.load:
        with open(os.path.join(folder, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        print(json.dumps(load_report(args.load, folder, vocab)))
        return None

    import keras

    from benchmarks import timing

    backend = keras.backend.backend()
    new = SMOKE_NEW if args.smoke else QUICK_NEW if args.quick else NEW
    repeats = 1 if args.smoke else 3 if args.quick else 7
    make_folder(folder, size)
    loadavg_start = timing.loadavg()
    print(f"backend {backend}, keras {keras.__version__}, loadavg {loadavg_start}, "
          f"{weight_count(size) / 1e6:.1f} M weights, folder {folder}")  # fmt: skip

    libraries = LIBRARIES[:2] if args.no_transformers else LIBRARIES
    loads = {name: fresh_load(name, folder) for name in libraries}
    print("| library | load s | first generate s | RSS high-water MiB: after the imports "
          "| after the load | after the first generate |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, report in loads.items():
        hwm = [report[k]["hwm_kib"] / 1024 for k in ("before", "after", "ready")]
        print(f"| {name} | {report['load_s']:.2f} | {report['first_generate_s']:.2f} "
              f"| {hwm[0]:.0f} | {hwm[1]:.0f} (+{hwm[1] - hwm[0]:.0f}) "
              f"| {hwm[2]:.0f} (+{hwm[2] - hwm[0]:.0f}) |", flush=True)  # fmt: skip

    bandwidth = timing.copy_bandwidth(8 if args.smoke else 256, 3 if args.smoke else 7)
    print(f"memory bandwidth, NumPy copy of {bandwidth['mib']} MiB (read + write): median "
          f"{bandwidth['gbps']:.1f} GB/s, best {bandwidth['max']:.1f}")  # fmt: skip
    models = {name: load(name, folder)[0] for name in libraries}
    if (
        not args.smoke and not args.no_transformers
    ):  # torch's threads on a busy machine: `transformers` at 1 thread too
        models["transformers 1 thread"] = models["transformers"]
    compile_error = None
    if not (args.smoke or args.no_compile or args.no_transformers):
        try:
            models["transformers compiled"] = compiled_transformers(models["transformers"])
        except Exception as error:  # noqa: BLE001
            compile_error = f"{type(error).__name__}: {error}"
    rows = compare(models, size, new, repeats, bandwidth)
    result = {
        "backend": backend, "size": size, "weights": weight_count(size), "folder": folder,
        "loadavg_start": loadavg_start, "loadavg_end": timing.loadavg(), "bandwidth": bandwidth,
        "loads": loads, "rows": rows, "compile_error": compile_error,
    }  # fmt: skip
    print(f"loadavg at the end {result['loadavg_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return result


if __name__ == "__main__":
    main()
