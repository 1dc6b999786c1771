"""Collects measured pointer-network runs into results/pointer.json and plots accuracy vs n.

    python results/pointer_results.py RUN.json [RUN.json ...]

Each RUN.json describes one measured run: {"task", "command", "status", "machine",
"metrics_file"} where `metrics_file` is the `*_metrics.json` that `keras-attn train`
wrote (or a dict `"metrics"` for a checkpoint evaluated with
`models.recipes.pointer.evaluate_backup`). Nothing here trains or extrapolates: it
copies measured numbers and draws them.
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Vinyals et al. 2015, "Pointer Networks", Table 1 (convex hull, LSTM Ptr-Net).
PAPER_HULL = {
    "trained n=50, tested n=50": {"accuracy": 0.726, "area": 0.999},
    "trained n=5-50, tested n=100": {"accuracy": 0.503, "area": 0.999},
}


def _sizes(metrics, key):
    """`{n: value}` for `nN_key` entries, plus the training test set under None."""
    found = {None: metrics[key]} if key in metrics else {}
    for name, value in metrics.items():
        match = re.fullmatch(r"n(\d+)_(.+)", name)
        if match and match.group(2) == key:
            found[int(match.group(1))] = value
    return found


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    seen = {"pointer-hull": 0, "pointer-sort": 0}
    for run in runs:
        metrics, ax = run["metrics"], axes[0 if run["task"] == "pointer-hull" else 1]
        style = "o-" if seen.get(run["task"], 0) == 0 else "s--"  # the first run of a task: solid
        seen[run["task"]] = seen.get(run["task"], 0) + 1
        keys = (  # valid polygons = exact answers in every measured run: not drawn twice
            [("sequence_accuracy", "greedy exact"), ("beam4_sequence_accuracy", "beam 4 exact")]
            if run["task"] == "pointer-hull"
            else [("sequence_accuracy", "exact"), ("per_position_accuracy", "per position")]
        )
        for key, label in keys:
            points = sorted((n, v) for n, v in _sizes(metrics, key).items() if n is not None)
            if points:
                ax.plot(*zip(*points, strict=True), style, label=f"{label} ({run['label']})")
    axes[0].plot([50, 100], [0.726, 0.503], "k*", markersize=10, label="paper, exact (Table 1)")
    axes[0].set(title="convex hull, trained on n=5..50", xlabel="n (test)", ylabel="share")
    axes[1].set(title="sorting, trained on n=5..20", xlabel="n (test)")
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        if "metrics_file" in run:
            with open(run.pop("metrics_file")) as f:
                run["metrics"] = json.load(f)
        runs.append(run)
    with open(os.path.join(HERE, "pointer.json"), "w") as f:
        json.dump({"paper_convex_hull": PAPER_HULL, "runs": runs}, f, indent=1)
    plot(runs, os.path.join(HERE, "pointer.png"))


if __name__ == "__main__":
    main(sys.argv[1:])
