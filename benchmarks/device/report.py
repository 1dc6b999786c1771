"""FLOP counts, and the device check's one table: rows from the parts, formatted.

Pure Python (no Keras): the report is written even when every measuring step failed.

FLOPs count a multiply-add as 2 and leave out the softmax, biases and the optimizer.
A training step (forward + backward) is 3 x the forward matmuls: the backward pass of
`Y = A B` takes two products of the same size (`dA` and `dB`). A flash kernel
recomputes `Q K^T` in its backward pass; that extra work is not counted (FlashAttention's
papers count it, 3.5 x forward: their TFLOP/s read 7/6 of ours for the same time).
"""

import glob
import json
import os
import statistics

from benchmarks.device import plan

GIB = 2**30


def attention_flops(batch, heads, q_len, k_len, head_dim, value_dim=None, train=True):
    """`Q K^T` and `P V` of `(B, h, Lq, dk)` heads: forward `2 B h Lq Lk (dk + dv)`."""
    value_dim = head_dim if value_dim is None else value_dim
    forward = 2 * batch * heads * q_len * k_len * (head_dim + value_dim)
    return 3 * forward if train else forward


def mha_step_flops(batch, length, dim, heads, train=True):
    """Self-attention MHA, `heads * key_dim = d`: `8 B L d^2` (Q, K, V, O) + the core.

    The same count as `benchmarks.cases.mha_flops` (which needs TensorFlow to import).
    """
    forward = 8 * batch * length * dim**2
    forward += attention_flops(batch, heads, length, length, dim // heads, train=False)
    return 3 * forward if train else forward


def row_flops(row):
    """The FLOPs of one timed row, or `None` (tests, fit)."""
    if row["part"] == "matmul peak":
        return 2 * row["n"] ** 3 if row.get("n") else None
    if row.get("dims") is None:
        return None
    batch, length, dim, heads = row["dims"]
    if row["part"] == "attention core":
        return attention_flops(batch, heads, length, length, dim // heads)
    if row["part"] == "train step":
        return mha_step_flops(batch, length, dim, heads)
    return None


def summarize(seconds):
    """`{"median", "min", "max"}` of per-step seconds."""
    return {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)}


def short_error(exc_or_text, limit=120):
    """One line of an error, `OOM` for out-of-memory errors of any backend."""
    text = str(exc_or_text)
    lowered = text.lower()
    if "resource_exhausted" in lowered or "out of memory" in lowered or "outofmemory" in lowered:
        return "OOM"
    name = type(exc_or_text).__name__ if isinstance(exc_or_text, BaseException) else ""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = f"{name}: {first}" if name else first
    return "error: " + (first[: limit - 3] + "..." if len(first) > limit else first)


def _cell(text):
    return str(text).replace("|", "/").replace("\n", " ").strip()


def fmt_ms(ms):
    """`{"median": 0.01234, ...}` seconds -> `"12.3 [12.1-13.0]"` milliseconds."""
    if not ms:
        return ""
    values = [1e3 * ms[k] for k in ("median", "min", "max")]
    digits = 3 if values[0] < 1 else (2 if values[0] < 10 else 1)
    med, low, high = (f"{v:.{digits}f}" for v in values)
    return f"{med} [{low}-{high}]"


def _peaks(rows):
    """backend -> measured bf16 matmul FLOP/s."""
    out = {}
    for row in rows:
        if row["part"] == "matmul peak" and row["dtype"] == "bfloat16" and row.get("time"):
            out[row["backend"]] = row_flops(row) / row["time"]["median"]
    return out


def _partner(row, by_key):
    key = plan.row_key(row)
    return by_key.get((*key[:-1], "keras")) if row["layer"] == "ours" else None


COLUMNS = (
    "part",
    "backend",
    "case",
    "B×L×d",
    "dtype",
    "layer",
    "kernel",
    "ms median [min-max]",
    "ours vs Keras",
    "TFLOP/s",
    "% bf16 peak",
    "peak GiB",
    "status",
)


def table_rows(rows):
    """The cells of each row: speed ratios, TFLOP/s and % of the peak filled in."""
    by_key = {plan.row_key(r): r for r in rows}
    peaks = _peaks(rows)
    cells = []
    for row in rows:
        time, flops = row.get("time"), row_flops(row)
        ratio = tflops = pct = ""
        partner = _partner(row, by_key)
        if time and partner and partner.get("time"):
            ratio = f"{partner['time']['median'] / time['median']:.2f}×"
        if time and flops:
            rate = flops / time["median"]
            tflops = f"{rate / 1e12:.3g}"
            if peaks.get(row["backend"]):
                pct = f"{100 * rate / peaks[row['backend']]:.0f} %"
        mem = row.get("mem_bytes")
        layer = {"ours": "keras_attn", "keras": "Keras"}.get(row["layer"], row["layer"])
        cells.append(
            [
                row["part"],
                row["backend"],
                row["case"],
                row["shape"],
                row["dtype"],
                layer,
                row.get("kernel", ""),
                fmt_ms(time),
                ratio,
                tflops,
                pct,
                "" if mem is None else f"{mem / GIB:.3g}",
                row.get("status", "not run"),
            ]
        )
    return cells


def markdown_table(rows):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for cells in table_rows(rows):
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def read_parts(parts_dir):
    """Every row the measuring steps wrote (`*.jsonl`), the last one per key winning."""
    found = {}
    for path in sorted(glob.glob(os.path.join(parts_dir, "*.jsonl"))):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    found[plan.row_key(row)] = row
    return found


def read_steps(parts_dir):
    """`check.sh`'s record of its steps: name -> {"rc", "seconds", "limit"}."""
    steps = {}
    path = os.path.join(parts_dir, "steps.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                name, rc, seconds, limit = line.rstrip("\n").split("\t")
                steps[name] = {"rc": int(rc), "seconds": int(seconds), "limit": int(limit)}
    return steps


STEP_OF_PART = {"tests": "tests", "zoo fit": "fit"}  # every other part: "speed"


def step_name(row):
    """The `check.sh` step that measures a row: `tests-jax`, `speed-torch`, `fit-jax`, ..."""
    return f"{STEP_OF_PART.get(row['part'], 'speed')}-{row['backend']}"


def _why_missing(row, steps):
    step = steps.get(step_name(row))
    if step is None:
        return "not run"
    if step["rc"] in (124, 137):
        return f"timed out (step limit {step['limit']} s)"
    if step["rc"] == -1:
        return "not run (no time left)"
    return f"not run (step exit {step['rc']})"


def merge(expected, found, steps):
    """The expected rows, each with what a step found, or why nothing was found."""
    rows = []
    for case in expected:
        row = found.get(plan.row_key(case))
        rows.append(row if row else {**case, "status": _why_missing(case, steps)})
    return rows


def header(mode, env, steps):
    versions = env.get("versions", {})
    lines = [
        "# keras-attn device check",
        "",
        f"- date: {env.get('date', '?')}; mode: {mode}",
        f"- device: {env.get('device', '?')}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "- steps (exit code, seconds / limit): "
        + ", ".join(f"{k} {v['rc']} ({v['seconds']}/{v['limit']} s)" for k, v in steps.items()),
        "- train step: forward + backward + SGD update of the layer, loss mean(y^2); JAX jitted"
        " (stateless_call), torch eager; median of timed samples after warmup; ours vs Keras ="
        " Keras' time / ours (> 1: ours faster). Keras' layer: default flash_attention=None"
        " (the backend's fused kernel where Keras' checks pass). Kernel: what"
        " keras_attn.ops.choose_implementation picked; +cuDNN fMHA where the compiled JAX step"
        " calls cuDNN's fused attention.",
        "- TFLOP/s: matmul FLOPs only, fwd+bwd = 3 x forward (no flash recompute); peak GiB:"
        " JAX, the compiled step's memory analysis; torch, max_memory_allocated.",
    ]
    return "\n".join(lines)


def write_report(mode, backends, parts_dir, out_dir):
    """Writes `device_check.md` and `device_check.json`; returns the rows."""
    env = {}
    env_path = os.path.join(parts_dir, "env.json")
    if os.path.exists(env_path):
        with open(env_path) as f:
            env = json.load(f)
    steps = read_steps(parts_dir)
    rows = merge(plan.all_cases(mode, backends), read_parts(parts_dir), steps)
    text = header(mode, env, steps) + "\n\n" + markdown_table(rows) + "\n"
    with open(os.path.join(out_dir, "device_check.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "device_check.json"), "w") as f:
        json.dump({"mode": mode, "env": env, "steps": steps, "rows": rows}, f, indent=1)
    return rows
