"""Where an experiment keeps its measurements: one JSON file, resumable run by run."""

import json
import os

import keras


def machine():
    """What the numbers were measured on, in words."""
    return f"{os.cpu_count()} CPU cores, keras {keras.__version__} ({keras.backend.backend()})"


def load(path, settings, free=()):
    """The results saved at `path` if they were measured with the same `settings`.

    Args:
        path: the JSON file (may not exist).
        settings: a dict of what the runs depend on.
        free: keys of `settings` that may differ (e.g. the list of lengths to run).

    Returns:
        The saved `results` dict, or `{}` when there is none or the settings differ.
    """
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        saved = json.load(f)

    def fixed(s):
        return {k: v for k, v in s.items() if k not in free}

    return saved["results"] if fixed(saved.get("settings", {})) == fixed(settings) else {}


def save(path, settings, results):
    """Writes `{"settings", "machine", "results"}` to `path` (after every run)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record = {"settings": settings, "machine": machine(), "results": results}
    temporary = f"{path}.partial"
    with open(temporary, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(temporary, path)  # a killed run never leaves half a file
