"""The device check (`benchmarks/device/`): its FLOP counts, table and parsing, and a dry run.

The GPU check itself runs on a lent machine only; here its pure functions are checked
against hand-computed values, and `check.sh --dry-run` (tiny shapes, JAX and torch on
CPU, TensorFlow blocked as on that machine) must fill every row of its table. No timing
is asserted.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # `benchmarks/` is not an installed package
    sys.path.insert(0, ROOT)

from benchmarks.device import bench, plan, report  # noqa: E402

SPEED_PARTS = {"matmul peak", "train step", "attention core", "zoo fit"}


def _row(part, layer="ours", dtype="float32", case="self-attention", dims=(1, 8, 16, 4), **kw):
    shape = "-" if dims is None else plan.fmt_shape(dims)
    row = {"part": part, "backend": "jax", "case": case, "shape": shape, "dtype": dtype}
    row.update(layer=layer, dims=None if dims is None else list(dims), **kw)
    return row


def test_attention_flops_hand_computed():
    # B=1, h=2, Lq=3, Lk=5, dk=4, dv=6: Q K^T 2*2*3*5*4 = 240, P V 2*2*3*5*6 = 360.
    assert report.attention_flops(1, 2, 3, 5, 4, 6, train=False) == 600
    assert report.attention_flops(1, 2, 3, 5, 4, 6) == 1800  # backward: dQ, dK, dP, dV
    # B=2, L=8, d=16, 4 heads: projections 8*2*8*16^2 = 32768; core 2*2*4*8*8*(4+4) = 8192.
    assert report.mha_step_flops(2, 8, 16, 4, train=False) == 40960
    assert report.mha_step_flops(2, 8, 16, 4) == 3 * 40960


def test_mha_step_flops_equal_the_cpu_benchmarks_count():
    pytest.importorskip("tensorflow")
    from benchmarks import cases

    for batch, length, dim in cases.SHAPES:
        ours = report.mha_step_flops(batch, length, dim, cases.NUM_HEADS)
        assert ours == cases.mha_flops(batch, length, dim, train=True)


def test_short_error_names_out_of_memory_and_keeps_one_line():
    xla = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 68.72GiB.")
    assert report.short_error(xla) == "OOM"
    assert report.short_error("torch.OutOfMemoryError: CUDA out of memory. Tried") == "OOM"
    bad = ValueError("bad shape\nsecond line")
    assert report.short_error(bad) == "error: ValueError: bad shape"
    long = report.short_error(TypeError("x" * 500), limit=40)
    assert long.startswith("error: TypeError: x") and long.endswith("...") and len(long) < 60


def test_fmt_ms_and_shape():
    assert report.fmt_ms({"median": 0.01234, "min": 0.0121, "max": 0.013}) == "12.3 [12.1-13.0]"
    assert report.fmt_ms({"median": 0.0002, "min": 0.0001, "max": 0.0003}) == "0.200 [0.100-0.300]"
    assert report.fmt_ms(None) == ""
    assert plan.fmt_shape((2, 4096, 1024, 16)) == "2×4096×1024 (16 heads)"


def test_table_fills_ratio_tflops_and_percent_of_the_peak():
    # bf16 peak: 2 * 1000^3 FLOPs in 1 ms = 2 TFLOP/s.
    peak = _row("matmul peak", "-", "bfloat16", "bf16 n^3", None, n=1000, status="ok")
    peak["time"] = {"median": 1e-3, "min": 1e-3, "max": 1e-3}
    ours = _row("train step", "ours", status="ok", kernel="fused", mem_bytes=2**30)
    ours["time"] = {"median": 1e-6, "min": 1e-6, "max": 2e-6}
    keras = _row("train step", "keras", status="error: a | b")
    keras_ok = {**keras, "time": {"median": 2e-6, "min": 2e-6, "max": 2e-6}, "status": "ok"}
    cells = report.table_rows([peak, ours, keras_ok])
    col = {name: i for i, name in enumerate(report.COLUMNS)}
    assert cells[0][col["TFLOP/s"]] == "2" and cells[0][col["% bf16 peak"]] == "100 %"
    # 3 * (8*1*8*16^2 + 2*1*4*8*8*(4+4)) = 61440 FLOPs in 1 us: 3.07 % of 2 TFLOP/s.
    assert cells[1][col["ours vs Keras"]] == "2.00×"
    assert cells[1][col["TFLOP/s"]] == "0.0614" and cells[1][col["% bf16 peak"]] == "3 %"
    assert cells[1][col["peak GiB"]] == "1" and cells[1][col["layer"]] == "keras_attn"
    assert cells[2][col["ours vs Keras"]] == ""  # only ours is compared
    table = report.markdown_table([peak, ours, keras]).splitlines()
    assert len(table) == 2 + 3 and all(line.count("|") == len(report.COLUMNS) + 1 for line in table)
    assert table[-1].endswith("| error: a / b |")  # a pipe would split the cell


def test_pytest_counts_from_the_summary_or_the_verbose_lines():
    log = "\n".join(
        [
            "tests/kernels/test_ops.py::test_a PASSED                        [ 33%]",
            "tests/kernels/test_ops.py::test_b[float32] FAILED               [ 66%]",
            "tests/kernels/test_ops.py::test_c SKIPPED (TensorFlow only)     [100%]",
            "FAILED tests/kernels/test_ops.py::test_b[float32] - TypeError: x",
            "=========== 1 failed, 1 passed, 1 skipped in 3.21s ===========",
        ]
    )
    counts, failed = bench.pytest_counts(log)
    assert counts == {"failed": 1, "passed": 1, "skipped": 1}
    assert failed == ["tests/kernels/test_ops.py::test_b[float32]"]
    cut = bench.pytest_counts("\n".join(log.splitlines()[:2]))[0]  # stopped: no summary
    assert cut == {"passed": 1, "failed": 1}
    assert bench.tests_status(cut, True) == "1 passed, 1 failed, stopped at the time limit"
    assert bench.tests_status({}, False) == "no test ran"


def test_plan_rows_are_unique_and_complete():
    rows = plan.all_cases("full")
    keys = [plan.row_key(r) for r in rows]
    assert len(keys) == len(set(keys))
    # per backend: 2 peaks, 3 shapes x 2 policies x 2 layers, 3 off-path x 2, 2 core shapes x 4
    assert len(rows) == 2 * (2 + 12 + 6 + 8) + 2 + 1  # tests per backend, fit on JAX
    long = [r for r in rows if r["part"] == "attention core"]
    assert {r["dims"][1] for r in long} == {4096, 32768}
    assert {r["shape"] for r in rows if r["part"] == "train step"} == {
        "8×512×512 (8 heads)",
        "2×4096×1024 (16 heads)",
        "1×32768×1024 (16 heads)",
    }


def test_report_says_why_a_row_is_missing(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "steps.tsv").write_text("tests-jax\t0\t5\t90\nspeed-jax\t124\t170\t170\n")
    tests_row = {**plan.test_cases(["jax"])[0], "status": "3 passed (5 s)"}
    (parts / "tests-jax.jsonl").write_text(json.dumps(tests_row) + "\n")
    rows = report.write_report("dry", ["jax"], str(parts), str(tmp_path))
    assert [r["status"] for r in rows][0] == "3 passed (5 s)"
    speed = [r for r in rows if report.step_name(r) == "speed-jax"]
    assert speed and all(r["status"] == "timed out (step limit 170 s)" for r in speed)
    assert rows[-1]["status"] == "not run"  # fit-jax: no step recorded
    text = (tmp_path / "device_check.md").read_text()
    assert text.count("\n| ") == len(rows) + 1  # the header row and one line per row
    assert json.loads((tmp_path / "device_check.json").read_text())["rows"] == rows


def test_no_tensorflow_blocks_like_an_absent_package():
    code = (
        "import importlib.util; from benchmarks.device import no_tensorflow; "
        "no_tensorflow.block(); assert importlib.util.find_spec('tensorflow') is None\n"
        "try:\n    import tensorflow\nexcept ModuleNotFoundError:\n    print('absent')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "absent", out.stderr


@pytest.mark.slow  # 2-4 minutes on 2 busy cores: seven processes import Keras and a backend
def test_dry_run_fills_every_row(tmp_path):
    # The dry run's steps run on JAX and on torch: the `jax` and `torch` extras.
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("KERAS_BACKEND", None)
    done = subprocess.run(
        ["bash", "benchmarks/device/check.sh", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "device_check.json").read_text())
    assert all(step["rc"] == 0 for step in result["steps"].values()), result["steps"]
    rows = result["rows"]
    assert [plan.row_key(r) for r in rows] == [plan.row_key(r) for r in plan.all_cases("dry")]
    for row in rows:
        if row["part"] == "tests":  # the selected tests all ran (a failure is the library's)
            counts = row["counts"]
            ran = counts.get("passed", 0) + counts.get("failed", 0)
            assert ran == len(bench.DRY_TESTS) and not counts.get("errors"), row
            assert "stopped" not in row["status"], row
        else:
            assert row["part"] in SPEED_PARTS and row["status"].startswith("ok"), row
            assert row["time"]["median"] > 0, row
    text = (tmp_path / "device_check.md").read_text()
    assert "- versions: python" in text and "keras 3.15" in text and "- device: " in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)
    assert not any("error" in line or "not run" in line for line in table[1:])
    ours = [c for c in report.table_rows(rows) if c[5] == "keras_attn"]
    assert ours and all(c[8].endswith("×") and float(c[9]) > 0 for c in ours)
