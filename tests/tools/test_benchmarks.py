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

from benchmarks import cases, eager, run, timing  # noqa: E402

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
