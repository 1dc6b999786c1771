"""The benchmark command runs end to end in its smoke mode and writes the documented JSON.

Nothing here asserts a timing: the smoke shapes are tiny and the machine is shared.
"""

import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # `benchmarks/` is not an installed package
    sys.path.insert(0, ROOT)

import keras  # noqa: E402
import pytest  # noqa: E402
from jax_subprocess import run_on_cpu_devices  # noqa: E402

from benchmarks import cases, eager, generation, run, timing  # noqa: E402

TIMES = {"times_s", "cpu_s", "median_s", "min_s", "max_s", "first_call_s", "tokens_per_s", "gflops"}
RATIO = {"median", "min", "max", "samples"}


def test_smoke_run_writes_the_documented_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    run.main(["--smoke", "--json", str(path)])
    report = json.loads(path.read_text())
    assert set(report) == {"meta", "peak", "memory", "speed", "complexity", "targets"}
    assert report["meta"]["mode"] == "smoke" and len(report["meta"]["loadavg_start"]) == 3
    assert report["peak"]["float32"]["gflops"] > 0 and report["peak"]["bfloat16"]["best_gflops"] > 0

    rows = report["speed"]
    # MHA train + infer and encoder train, per policy.
    assert [(r["family"], r["mode"], r["policy"]) for r in rows] == [
        (family, mode, policy)
        for policy in cases.POLICIES
        for family, mode in [("mha", "train"), ("mha", "infer"), ("encoder", "train")]
    ]
    for row in rows:
        if row["status"] == "skipped":  # keras-hub missing: a clear reason instead
            assert row["family"] == "encoder" and "keras-hub" in row["reason"]
            continue
        assert row["status"] == "ok"
        assert TIMES <= set(row["ours"]) and TIMES <= set(row["peer"])
        assert len(row["ours"]["times_s"]) == report["meta"]["settings"]["repeats"]
        assert RATIO <= set(row["ratio"]) and row["probe_gflops"] > 0
        assert row["flops"] > 0 and row["ours"]["pct_probe"] > 0
        mixed_train = row["policy"] == "mixed_bfloat16" and row["mode"] == "train"
        assert ("ratio_vs_peer_fp32" in row) == mixed_train
        assert ("peer_fp32" in row) == mixed_train

    (mem,) = report["memory"]
    assert mem["status"] == "ok", mem
    assert mem["impl"] == "auto" and mem["peak_rss_mib"] >= mem["rss_before_mib"] > 0

    layers = report["complexity"]["layers"]
    assert set(layers) == {"self-attention", "recurrent", "convolutional"}
    for result in layers.values():
        assert {
            "slope_length",
            "slope_width",
            "fit_length",
            "fit_width",
            "fixed_work_growth",
        } <= set(result)
    assert (
        os.path.exists(report["complexity"]["plot"])
        or "not drawn" in (report["complexity"]["plot"])
    )

    printed = capsys.readouterr().out
    assert "| MHA vs keras MHA | train | fp32 | 2x16x32 |" in printed
    assert "Transformer paper, Table 1" in printed


def test_encoder_row_is_skipped_with_a_message_without_keras_hub(monkeypatch):
    monkeypatch.setattr(cases, "keras_hub_or_none", lambda: None)
    row = run.bench_pair("encoder", "train", (2, 16, 32), "float32", run.SETTINGS["smoke"])
    assert row["status"] == "skipped" and "pip install keras-hub" in row["reason"]
    assert "skipped: keras-hub is not installed" in run.speed_table([row])


def test_time_group_interleaves_and_reports_ratios():
    calls = []

    def make(name):
        def fn():
            calls.append(name)
            return 0.0

        return fn

    result = timing.time_group({"a": make("a"), "b": make("b")}, (), repeats=4, min_time=0)
    assert calls == ["a", "a", "b", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(result["a"]["times_s"]) == 4 and len(result["ratio"]["b"]["samples"]) == 4
    assert set(result["cpu_ratio"]) == {"b"}


def test_targets_read_the_rows():
    row = {
        "family": "mha", "mode": "train", "policy": "float32", "batch": 8, "length": 512,
        "dim": 512, "status": "ok", "ratio": {"median": 1.6}, "ours": {"pct_probe": 55.0},
        "probe_gflops": 200.0, "peer": {"gflops": 160.0},
    }  # fmt: skip
    mem = {"impl": "auto", "length": 16384, "mode": "train", "batch": 1, "dim": 256,
           "status": "ok", "peak_rss_mib": 1100.0}  # fmt: skip
    found = run.targets([row], [mem])
    got = {t["target"]: t["met"] for t in found}
    assert got == {
        "MHA train fp32 >= 1.5x keras": True,
        "MHA train fp32 >= 60% of fp32 matmul": False,
        "MHA fwd+bwd B1 L16384 d256 peak RSS < 2 GiB": True,
    }
    # Keras at 160 of the 200 GFLOP/s the matmul reaches: ours can be 1.25x at most.
    assert abs(found[0]["ceiling"] - 200.0 / 160.0) < 1e-12
    assert found[2]["ceiling"] is None


def test_eager_smoke_prints_every_row_with_positive_finite_ratios(tmp_path, capsys):
    path = tmp_path / "eager.json"
    report = eager.main(["--smoke", "--json", str(path)])
    assert json.loads(path.read_text())["meta"]["mode"] == "smoke"
    rows = report["eager"]
    assert [(r["section"], r["length"], r["variant"]) for r in rows] == [
        ("mha", 1, None),
        ("decoder", 1, None),
        ("cached_step", 1, "KVCache"),
        ("cached_step", 1, "keras-hub cache"),
    ]
    train = report["train"]
    assert len(train) == 1 and (train[0]["status"] == "ok") == (keras.backend.backend() == "torch")
    for row in rows + train:
        if row["status"] == "skipped":  # keras-hub missing, or the training row off torch
            continue
        ratios = [row["ratio"][k] for k in ("median", "min", "max")] + row["ratio"]["samples"]
        assert all(math.isfinite(r) and r > 0 for r in ratios), row["ratio"]
        # The weights are copied from the peer: both compute the same function.
        assert row.get("max_abs_diff", 0.0) < 1e-4

    printed = capsys.readouterr().out
    assert "| MHA vs keras MHA, causal | 1x1x256 |" in printed
    assert "| DecoderBlock vs keras-hub TransformerDecoder | 1x1x256 |" in printed
    assert "(KVCache) vs keras-hub (its cache) | 1x1x256 |" in printed
    assert "| causal self-attention, MSE, SGD | 2x16x32 |" in printed


def test_xla_memory_reads_the_buffers_a_program_allocates():
    """`benchmarks.generation.xla_memory`: XLA's temp buffers, against hand-counted sizes."""
    jax = pytest.importorskip("jax")  # the `jax` extra; the README's `.[test]` venv has none
    import jax.numpy as jnp

    from benchmarks import generation

    x = jnp.ones((1024, 8), "float32")
    # A (1024, 1024) float32 product, sorted: at least its 4 MiB live at once.
    scores = generation.xla_memory(lambda: jax.jit(lambda x: jnp.sort((x @ x.T).ravel())[:3])(x))
    assert scores["temp_mib"] >= 4 and scores["programs"] == 1
    assert scores["argument_mib"] == 1024 * 8 * 4 / 2**20
    # One fused elementwise-and-sum: nothing close to that size.
    fused = generation.xla_memory(lambda: jax.jit(lambda x: (2 * x).sum())(x))
    assert fused["temp_mib"] < 0.1
    assert jax.jit is not None and "recording" not in jax.jit.__name__  # jax.jit given back


def test_sharding_smoke_prints_both_tables_and_the_step_times(tmp_path):
    """`benchmarks.sharding --tiny`: the bytes tables and the step times (a JAX subprocess)."""
    pytest.importorskip("jax")
    paths = tmp_path / "bytes.json", tmp_path / "step.json"
    script = (
        "from benchmarks import sharding\n"
        f"sharding.main(['--tiny', '--json', {str(paths[0])!r}])\n"
        f"sharding.main(['--tiny', '--step-time', '--repeats', '1', '--json', {str(paths[1])!r}])"
    )
    result = run_on_cpu_devices(8, "-c", script)
    heads12, heads16 = json.loads(paths[0].read_text())["models"].values()
    assert [r["model_axis"] for r in heads12["rows"]] == [1, 2, 4, 6, 8]
    assert "(12) is not a multiple of 8" in heads12["rows"][-1]["error"]
    assert heads12["bound"] is None  # no (1, 8) row
    assert [r["model_axis"] for r in heads16["rows"]] == [1, 2, 4, 8]
    assert heads16["bound"]["model_axis"] == 8 and heads16["bound"]["holds"] is True
    assert "bytes(1, 8) <= bytes(1) / 8 + replicated: True" in result.stdout

    times = json.loads(paths[1].read_text())["step_time"]
    meshes = ["one device", "(8, 1)", "(1, 8)", "(2, 4)"]
    assert set(times["ratio"]) == set(meshes[1:])
    for name in meshes:
        assert len(times[name]["times_s"]) == 1 and times[name]["median_s"] > 0
        assert f"| {name} | " in result.stdout


def _positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_roofline_smoke_writes_every_section_with_its_limit_and_share(tmp_path, capsys):
    """`python -m benchmarks.roofline --smoke`: the limits, the training rows, the decoding row."""
    pytest.importorskip("keras_hub")
    from benchmarks import roofline

    path = tmp_path / "roofline.json"
    # One policy keeps the test short; the mixed one switches the global policy for the LM.
    roofline.main(["--smoke", "--policies", "mixed_bfloat16", "--json", str(path)])
    report = json.loads(path.read_text())
    assert set(report) == {"meta", "limits", "training", "decode"}
    assert report["meta"]["sections"] == sorted(roofline.SECTIONS)
    limits = report["limits"]
    for when in ("start", "end"):
        for dtype in ("float32", "bfloat16"):
            assert _positive_finite(limits[when]["matmul"][dtype]["max"])
        assert _positive_finite(limits[when]["copy"]["gbps"])
        assert limits[when]["read"]["method"] in ("numpy_sum", "tf_reduce_sum")
        assert len(limits[when]["read"]["numpy_sum"]["samples"]) == 2
    best = limits["best"]
    assert set(best) == {"matmul_float32", "matmul_bfloat16", "copy", "read"}
    assert best["copy"] == max(limits[w]["copy"]["max"] for w in ("start", "end"))

    rows = report["training"]
    assert [(r["family"], r["policy"]) for r in rows] == [
        ("mha", "mixed_bfloat16"),
        ("encoder", "mixed_bfloat16"),
        ("lm", "mixed_bfloat16"),
    ]
    for row in rows:
        assert row["status"] == "ok" and row["limit_gflops"] == best["matmul_bfloat16"]
        assert _positive_finite(row["flops"]) and RATIO <= set(row["ratio"])
        for side in ("ours", "peer"):
            assert TIMES <= set(row[side]) and _positive_finite(row[side]["pct_peak"])
    lm = rows[-1]
    assert lm["flops"] == cases.lm_flops(2, 16, 1, 32, 64, 5000, train=True)

    decode, half, int8 = report["decode"]
    assert [r["policy"] for r in (decode, half, int8)] == ["float32", "bfloat16", "int8"]
    assert decode["status"] == "ok" and decode["same_tokens"] is True
    assert decode["bytes_per_step"] > 0 and decode["limit_gbps"]["copy"] == best["copy"]
    assert half["status"] == "ok" and half["bytes_per_step"] == decode["bytes_per_step"] / 2
    size, length = generation.TINY, decode["cache_length"]
    cache = generation.decode_bytes(size, 1, length) - generation.decode_bytes(size, 1, 0)
    assert int8["status"] == "ok"
    assert int8["bytes_per_step"] == pytest.approx((decode["bytes_per_step"] - cache) / 4 + cache)
    for row in (decode, half, int8):
        for side in ("ours", "keras-hub"):
            assert _positive_finite(row[side]["whole_tokens_per_s"])
            assert len(row[side]["step_s"]["samples"]) == 3
            # A tiny model's step can drown in the noise of the difference: then no share.
            shares = [row[side]["pct_copy"], row[side]["pct_read"]]
            assert all(_positive_finite(s) for s in shares) or shares == [None, None]

    printed = capsys.readouterr().out
    assert "| copy, GB/s (read + write): decoding limit |" in printed
    assert "| mixed_bf16 | 2x16x32 |" in printed
    assert "`transformer_lm` vs keras-hub's `GPT2CausalLM`" in printed
    assert "| 1 layers, hidden 32, vocabulary 5000 | float32 | 8, new 3..34 |" in printed
    assert "| 1 layers, hidden 32, vocabulary 5000 | bfloat16 | 8, new 3..34 |" in printed


def test_lm_flops_count_every_matmul():
    # B2 L3, 1 layer, d4, I8, V10: 8*2*3*16 + 4*2*9*4 + 4*2*3*4*8 = 768 + 288 + 768; logits 480
    assert cases.lm_flops(2, 3, 1, 4, 8, 10, train=False) == 768 + 288 + 768 + 480
    assert cases.lm_flops(2, 3, 2, 4, 8, 10, train=True) == 3 * (2 * 1824 + 480)


def test_decode_bytes_counts_every_weight_once_and_the_cache():
    from benchmarks import generation

    size = dict(vocabulary_size=10, num_layers=2, num_heads=2, hidden_dim=4, intermediate_dim=8)
    # per block: q, k, v, o kernels 4*16 + biases 4*4, FFN 4*8 + 8 + 8*4 + 4, two norms 4*4
    block = 64 + 16 + 32 + 8 + 32 + 4 + 16
    weights = 2 * block + 10 * 4 + 2 * 4 + 3 * 4  # table, final norm, 3 position rows
    cache = 2 * 2 * 3 * 5.5 * 4  # keys and values, 2 layers, B3, 5.5 positions, d4
    assert generation.decode_bytes(size, 3, 5.5) == 4 * (weights + cache)
    assert generation.decode_bytes(size, 3, 5.5, itemsize=2) == 2 * (weights + cache)
    # Steps 9..40 after a 32-token prompt attend to 40..71 positions.
    assert generation.mean_cache_length(32, 9, 40) == (40 + 71) / 2

    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.GPT2Backbone(**size, max_sequence_length=16)
    # The same count from the model: every weight but the position table, of which 1 row.
    assert generation.decode_bytes(size, 1, 0) == 4 * (backbone.count_params() - 16 * 4 + 4)


def test_generation_gpt2_small_smoke_is_tiny_and_reads_bytes_against_the_copy(tmp_path, capsys):
    """`benchmarks.generation --gpt2-small --smoke`: batch 1 and 8, a tiny model, bytes/s."""
    pytest.importorskip("keras_hub")
    from benchmarks import generation

    path = tmp_path / "gpt2.json"
    rows = generation.main(["--gpt2-small", "--smoke", "--no-memory", "--json", str(path)])
    report = json.loads(path.read_text())
    assert report["size"] == generation.TINY and set(report) == {
        "backend",
        "size",
        "bandwidth",
        "rows",
    }
    assert _positive_finite(report["bandwidth"]["gbps"])
    assert [(r["batch"], r["prompt"], r["new"]) for r in rows] == [(1, 8, 4), (8, 8, 4)]
    for row in rows:
        assert row["same_tokens"] is True
        assert row["bytes"]["per_step"] == generation.decode_bytes(
            generation.TINY, row["batch"], generation.mean_cache_length(8, 1, 4)
        )
        for side in ("ours", "keras-hub"):
            assert _positive_finite(row["bytes"][side]["pct_bandwidth"])
    assert "| greedy | 8 | 8 + 4 |" in capsys.readouterr().out


def test_attention_profile_runs_every_piece(capsys):
    from benchmarks import profile

    result = profile.attention(shape=(1, 2, 16, 4), repeats=1)
    pieces = [name for name in result if name not in ("ratio", "cpu_ratio")]
    assert len(pieces) == 7 and all(result[name]["median_s"] > 0 for name in pieces)
    printed = capsys.readouterr().out
    assert "the scores are 0 MB" in printed
    assert "| fused kernel, forward + backward (XLA) |" in printed


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matvec_profile_times_every_kernel_layout_both_ways(capsys, dtype):
    from benchmarks import profile

    result = profile.matvec(width=16, heads=4, count=3, repeats=1, dtype=dtype)
    assert len(result) >= 8 and all(result[name]["median_s"] > 0 for name in result if "," in name)
    printed = capsys.readouterr().out
    assert "| 3-D kernel reshaped, + bias, XLA |" in printed and "GB/s of" in printed
    assert f"(16, 16), {dtype}" in printed


def test_decode_ops_profile_splits_both_steps_by_op_type(capsys):
    pytest.importorskip("keras_hub")
    from benchmarks import profile

    config = dict(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
                  intermediate_dim=16, max_sequence_length=64)  # fmt: skip
    ops, walls = profile.decode_ops(config, calls=1, repeats=1, prompt=4)
    for side in ("ours", "keras-hub"):
        assert any("MatMul" in kind for kind in ops[side]) and walls[side]["median_s"] > 0
    assert any("dot" in kind for kind in ops["ours, XLA"])
    assert "| every matmul |" in capsys.readouterr().out


def test_speculative_smoke_rows_are_the_targets_tokens(tmp_path, capsys):
    """`benchmarks.speculative --smoke`: both drafts give the target's tokens; the target as
    its own draft accepts every proposal (3 tokens a round at k = 2, the last round 2)."""
    from benchmarks import speculative

    path = tmp_path / "speculative.json"
    rows = speculative.main(["--smoke", "--json", str(path)])
    assert json.loads(path.read_text())["rows"] == rows
    assert [row["draft"] for row in rows] == ["small", "the target"]
    assert all(row["same_tokens"] for row in rows)
    assert rows[1]["acceptance_rate"] == 1.0 and rows[1]["tokens_per_round"] == 8 / 3
    for row in rows:
        assert _positive_finite(row["plain_tokens_per_s"])
        assert _positive_finite(row["speculative_tokens_per_s"])
    assert "| the target (" in capsys.readouterr().out


def test_llama_weight_count_and_decode_bytes_count_transformers_parameters():
    """`benchmarks.llama`: the weights of a Llama of transformers' own (tied and untied), and
    the bytes of a decoding step counted by hand."""
    transformers = pytest.importorskip("transformers")
    from benchmarks import llama

    for tied in (True, False):
        size = {**llama.TINY, "tie_word_embeddings": tied}
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**size))
        assert llama.weight_count(size) == model.num_parameters()
    # TINY: d32, 2 layers, 4 heads of 8, 2 key/value heads (16 wide), intermediate 64, V512.
    block = 32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 64 + 2 * 32
    cache = 2 * 2 * 3 * 5.5 * 16  # keys and values, 2 layers, B3, 5.5 positions, 16 wide
    assert llama.decode_bytes(llama.TINY, 3, 5.5) == 4 * (2 * block + 512 * 32 + 32 + cache)
    untied = {**llama.TINY, "tie_word_embeddings": False}  # + the lookup's 3 rows
    assert llama.decode_bytes(untied, 3, 5.5) == llama.decode_bytes(llama.TINY, 3, 5.5) + 4 * 96
    # The full size is the "about 100 M".
    assert round(llama.weight_count(llama.LLAMA) / 1e6, 1) == 100.1


@pytest.mark.slow
def test_llama_benchmark_smoke(tmp_path, capsys):
    """`benchmarks.llama --smoke`: a tiny Llama that transformers saves, loaded in fresh
    processes by the three libraries, the same greedy tokens from each, speeds > 0."""
    pytest.importorskip("transformers")
    pytest.importorskip("keras_hub")
    from benchmarks import llama

    path = tmp_path / "llama.json"
    report = llama.main(["--smoke", "--folder", str(tmp_path / "ckpt"), "--json", str(path)])
    assert json.loads(path.read_text())["size"] == llama.TINY
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    assert set(report["loads"]) == set(llama.LIBRARIES)
    for load in report["loads"].values():
        assert _positive_finite(load["load_s"])
        assert load["after"]["hwm_kib"] >= load["before"]["hwm_kib"] > 0
    assert [(r["batch"], r["prompt"], r["new"]) for r in report["rows"]] == [(1, 32, 4), (8, 32, 4)]
    for row in report["rows"]:
        assert row["errors"] == {}
        assert row["same_tokens"] == {"keras-hub": True, "transformers": True}
        assert all(_positive_finite(v) for v in row["tokens_per_s"].values())
        assert row["bytes"]["per_step"] == llama.decode_bytes(
            llama.TINY, row["batch"], 32 - 1 + 2.5
        )
    assert "| 8 | 32 + 4 |" in capsys.readouterr().out
