"""Files written whole or not at all.

`write_atomically` writes an export (`.keras`, a SavedModel, a weights file)
aside and renames it into place, so a failed or killed write never leaves half
of one where a reader (a restart, a server) looks.
"""

import os
import shutil
import uuid


def write_atomically(path, write):
    """Calls `write(temporary)`, a fresh sibling of `path`, then renames it to `path`.

    Until the rename `path` is absent or still the previous version: a failed or killed
    write never leaves half a file or SavedModel there (a failed one removes its
    temporary; a killed one leaves a hidden `.tmp-*` sibling). A directory replaces a
    directory by two renames, the old one aside (`.old-*`) then deleted. The temporary
    ends like `path` (`model.save` wants `.keras`). A URL (`gs://...`) is written in
    place. E.g. `write_atomically("runs/model_savedmodel", model.export)`.
    """
    if "://" in str(path):
        return write(path)
    parent, name = os.path.split(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    temporary = os.path.join(parent, f".tmp-{token}-{name}")
    try:
        write(temporary)
        if os.path.exists(path) and (os.path.isdir(path) or os.path.isdir(temporary)):
            old = os.path.join(parent, f".old-{token}-{name}")
            os.rename(path, old)
            try:
                os.rename(temporary, path)
            except BaseException:
                os.rename(old, path)
                raise
            _remove(old)
        else:
            os.replace(temporary, path)
    except BaseException:
        _remove(temporary)
        raise


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        return shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        os.remove(path)
