"""The device check's Python steps, one subcommand each (`check.sh` runs them in order).

    python -m benchmarks.device.bench env    --parts DIR
    python -m benchmarks.device.bench tests  --parts DIR --backend jax --limit 90 [files]
    python -m benchmarks.device.bench speed  --parts DIR --backend jax --budget 170
    python -m benchmarks.device.bench fit    --parts DIR --backend jax
    python -m benchmarks.device.bench report --parts DIR --out DIR

Add `--dry-run` for the tiny plan (`plan.DRY_SHAPES`). Each measuring step appends one
JSON line per row to `DIR/<step>.jsonl` as it goes, catching errors (and OOM) per row,
so a step stopped by its time limit keeps what it measured; `report` fills in every
row of the plan, measured or not, and says why not. `speed` runs each length in its
own process (a crash or a hung kernel costs one length; JAX's peak memory starts from
zero), sharing its time budget among them.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

from benchmarks.device import plan, report

FULL_TESTS = (
    "tests/kernels/test_ops.py",
    "tests/layers/test_multi_head_attention.py",
    "tests/kernels/test_fast_paths.py",
    "tests/kernels/test_chunked_attention.py",
    "tests/kernels/test_backend_kernel.py",  # the backend's fused kernel
)
DRY_TESTS = (
    "tests/kernels/test_ops.py::test_hand_computed_case",
    "tests/kernels/test_ops.py::test_causal_mask_end_aligned",
)
# speed: the share of the budget each length's process gets (the longest needs most)
GROUP_WEIGHTS = (0.8, 1.0, 1.4)
PYTEST_BOOT = (
    "import sys; from benchmarks.device import no_tensorflow; no_tensorflow.block(); "
    "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
)


def _mode(args):
    return "dry" if args.dry_run else "full"


def _start_keras(backend):
    """Sets the backend and blocks TensorFlow before Keras is imported."""
    os.environ["KERAS_BACKEND"] = backend
    from benchmarks.device import no_tensorflow

    no_tensorflow.block()


def _append(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


# -- env ----------------------------------------------------------------------------


def _version(name):
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _device():
    found = []
    try:
        query = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        smi = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=20)
        if smi.returncode == 0 and smi.stdout.strip():
            found.append("nvidia-smi: " + "; ".join(smi.stdout.strip().splitlines()))
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        import jax

        found.append(f"jax: {jax.devices()}")
    except Exception as exc:
        found.append(f"jax: {report.short_error(exc)}")
    try:
        import torch

        cuda = torch.cuda.is_available()
        found.append(f"torch: {torch.cuda.get_device_name(0) if cuda else 'cpu'}")
    except Exception as exc:
        found.append(f"torch: {report.short_error(exc)}")
    return "; ".join(found)


def cmd_env(args):
    _start_keras("jax")
    versions = {"python": sys.version.split()[0]}
    for name in ("numpy", "jax", "jaxlib", "torch", "keras", "pytest"):
        versions[name] = _version(name)
    try:
        import keras_attn

        where = os.path.relpath(os.path.dirname(keras_attn.__file__))
        versions["keras_attn"] = f"{keras_attn.__version__} ({where})"
    except Exception as exc:
        versions["keras_attn"] = report.short_error(exc)
    env = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": versions,
        "device": _device(),
    }
    with open(os.path.join(args.parts, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    print(json.dumps(env, indent=1))


# -- tests --------------------------------------------------------------------------

_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
_VERBOSE = re.compile(r"^(\S+::\S+).*? (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def pytest_counts(log_text):
    """`{"passed": n, "failed": n, ...}` and the failed test ids, from `pytest -v` output.

    The final summary line when there is one; else (a run stopped by its limit) the
    per-test lines of `-v`.
    """
    lines = log_text.splitlines()
    matches = [m for m in map(_VERBOSE.match, lines) if m]
    failed = [m.group(1) for m in matches if m.group(2) in {"FAILED", "ERROR"}]
    summary = [ln for ln in lines if ln.startswith("=") and (" in " in ln) and _SUMMARY.search(ln)]
    counts = {}
    if summary:
        for number, word in _SUMMARY.findall(summary[-1]):
            counts["errors" if word.startswith("error") else word] = int(number)
    else:
        names = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}
        for m in matches:
            key = names.get(m.group(2), m.group(2).lower())
            counts[key] = counts.get(key, 0) + 1
    return counts, failed


def tests_status(counts, interrupted):
    order = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
    text = ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))
    text = text or "no test ran"
    return text + (", stopped at the time limit" if interrupted else "")


def cmd_tests(args):
    chosen = DRY_TESTS if args.dry_run else FULL_TESTS
    files = args.files or [f for f in chosen if os.path.exists(f.split("::")[0])]
    log_path = os.path.join(args.logs, f"tests-{args.backend}.log")
    env = {**os.environ, "KERAS_BACKEND": args.backend}
    command = [sys.executable, "-c", PYTEST_BOOT, "-v", "-p", "no:cacheprovider", *files]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        interrupted = False
        try:
            proc.wait(timeout=args.limit)
        except subprocess.TimeoutExpired:
            interrupted = True
            proc.send_signal(2)  # SIGINT: pytest stops and prints its summary
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    with open(log_path) as f:
        counts, failed = pytest_counts(f.read())
    row = plan.test_cases([args.backend])[0]
    seconds = time.perf_counter() - start
    row.update(
        counts=counts,
        failed_tests=failed[:50],
        files=files,
        seconds=seconds,
        rc=proc.returncode,
        status=f"{tests_status(counts, interrupted)} ({seconds:.0f} s)",
    )
    _append(os.path.join(args.parts, f"tests-{args.backend}.jsonl"), row)
    print(row["status"])


# -- speed --------------------------------------------------------------------------


def _measure_case(row, settings, steps):
    steps.reset_peak()
    kernel = ""
    if row["part"] == "matmul peak":
        row["n"] = settings["matmul_n"]
        run, info = steps.matmul_step(row, row["n"])
    elif row["part"] == "train step":
        kernel = steps.chosen_kernel(row["layer"], row["dims"], row["case"], row["dtype"])
        run, info = steps.layer_step(row)
    else:
        kernel = steps.chosen_kernel(row["layer"], row["dims"], "self-attention", row["dtype"])
        run, info = steps.core_step(row)
    if info.get("cudnn"):
        kernel += " +cuDNN fMHA"
    timing, calls = steps.measure(
        run, settings["warmup"], settings["repeats"], settings["min_sample_s"]
    )
    peak = steps.peak_bytes()
    mem = info.get("mem_bytes") if steps.backend() == "jax" else peak
    row.update(time=timing, calls_per_sample=calls, kernel=kernel.strip(), mem_bytes=mem)
    row.update(compile_s=info["compile_s"], process_peak_bytes=peak, status="ok")


def cmd_group(args):
    """One process: the cases of some lengths, one JSON line each."""
    _start_keras(args.backend)
    from benchmarks.device import steps

    mode = _mode(args)
    settings = plan.SETTINGS[mode]
    for length in args.lengths:
        for row in plan.speed_cases(mode, args.backend, length):
            start = time.perf_counter()
            if time.time() > args.deadline:
                row["status"] = "not run (no time left)"
            else:
                try:
                    _measure_case(row, settings, steps)
                except Exception as exc:  # OOM and kernel errors: recorded, the next case runs
                    row["status"] = report.short_error(exc)
                steps.free()
            _append(args.out, row)
            took = f"{time.perf_counter() - start:.1f} s"
            print(*(row[k] for k in ("part", "case", "shape", "dtype", "layer", "status")), took)
            sys.stdout.flush()


def _missing(path, cases, status):
    done = set(report.read_parts(os.path.dirname(path)))
    for row in cases:
        if plan.row_key(row) not in done:
            _append(path, {**row, "status": status})


def cmd_speed(args):
    mode = _mode(args)
    lengths = [shape[1] for shape in plan.shapes(mode)]
    groups = [[length] for length in lengths] if mode == "full" else [lengths]
    weights = GROUP_WEIGHTS[: len(groups)] if mode == "full" else (1.0,)
    out = os.path.join(args.parts, f"speed-{args.backend}.jsonl")
    deadline = time.time() + args.budget
    for i, group in enumerate(groups):
        cases = [c for length in group for c in plan.speed_cases(mode, args.backend, length)]
        limit = (deadline - time.time()) * weights[i] / sum(weights[i:])
        if limit < 5:
            _missing(out, cases, "not run (no time left)")
            continue
        command = [sys.executable, "-m", "benchmarks.device.bench", "group", "--out", out]
        # no new case after the deadline: the running one has the rest of the limit to finish
        last_start = time.time() + max(limit - 10, 0.7 * limit)
        command += ["--backend", args.backend, "--deadline", str(last_start)]
        command += ["--lengths", *map(str, group)] + (["--dry-run"] if args.dry_run else [])
        log_path = os.path.join(args.logs, f"speed-{args.backend}.log")
        with open(log_path, "a") as log:
            try:
                rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=limit)
                status = f"crashed (exit {rc.returncode}; see logs)" if rc.returncode else None
            except subprocess.TimeoutExpired:
                status = f"timed out (its length's limit {limit:.0f} s)"
        if status:
            _missing(out, cases, status)
    rows = sum(1 for _ in open(out)) if os.path.exists(out) else 0
    print(f"speed-{args.backend}: {rows} rows in {out}")


# -- fit ----------------------------------------------------------------------------


def cmd_fit(args):
    """A few steps of `model.fit` of a zoo model: it trains on this backend and device."""
    _start_keras(args.backend)
    import keras
    import numpy as np

    from keras_attn import models

    row = plan.fit_cases([args.backend])[0]
    dry = (100, 16, 8, 2, 32, 1)
    vocab, length, batch, steps, dim, layers = dry if args.dry_run else (8000, 256, 32, 20, 256, 2)
    try:
        model = models.transformer_classifier(
            vocab, length, 2, num_layers=layers, num_heads=4, d_model=dim, intermediate_dim=2 * dim
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        rng = np.random.default_rng(0)
        x = rng.integers(1, vocab, (batch * steps, length)).astype("int32")
        y = (x[:, 0] % 2).astype("int32")
        start = time.perf_counter()
        first = model.fit(x, y, batch_size=batch, epochs=1, verbose=0).history["loss"][-1]
        middle = time.perf_counter()
        last = model.fit(x, y, batch_size=batch, epochs=1, verbose=0).history["loss"][-1]
        per_step = (time.perf_counter() - middle) / steps
        row.update(time=report.summarize([per_step]), compile_s=middle - start)
        ok = bool(np.isfinite(first) and np.isfinite(last))
        state = "ok" if ok else "error: non-finite loss"
        row["status"] = f"{state}: 2 epochs of {steps} steps, loss {first:.3f} -> {last:.3f}"
    except Exception as exc:
        row["status"] = report.short_error(exc)
    _append(os.path.join(args.parts, f"fit-{args.backend}.jsonl"), row)
    print(row["status"])


def cmd_report(args):
    backends = args.backends.split(",")
    report.write_report(_mode(args), backends, args.parts, args.out)
    with open(os.path.join(args.out, "device_check.md")) as f:
        print(f.read())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.device.bench")
    parser.add_argument("command", choices=("env", "tests", "speed", "group", "fit", "report"))
    parser.add_argument("files", nargs="*", help="tests: the test files (default: the plan's)")
    parser.add_argument("--parts", default=".", help="where the steps write their rows")
    parser.add_argument("--logs", default=".", help="where the subprocesses' output goes")
    parser.add_argument("--out", default=".", help="report: the folder; group: the .jsonl")
    parser.add_argument("--backend", default="jax", choices=plan.BACKENDS)
    parser.add_argument("--backends", default=",".join(plan.BACKENDS))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--limit", type=float, default=90.0, help="tests: seconds")
    parser.add_argument("--budget", type=float, default=170.0, help="speed: seconds")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="group: epoch s")
    parser.add_argument("--lengths", type=int, nargs="*", default=[])
    args = parser.parse_args(argv)
    commands = {"env": cmd_env, "tests": cmd_tests, "speed": cmd_speed, "group": cmd_group}
    commands.update(fit=cmd_fit, report=cmd_report)
    commands[args.command](args)


if __name__ == "__main__":
    main()
