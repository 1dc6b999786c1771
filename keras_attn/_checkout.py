"""`keras_attn.models` in a source checkout: the repository's `models/` folder.

The model zoo's source is the top-level `models/` folder of the repository, beside
`keras_attn/`. An install (wheel or editable) places it as `keras_attn.models` through
setuptools' `package_dir`; a top-level `models` is never installed. A checkout run from
its root (pytest's `pythonpath`, `PYTHONPATH=$PWD`) has `keras_attn/` but no
`keras_attn/models/`: there `map_models_folder` adds a finder for that one name, so that
`import keras_attn.models` loads the folder beside the `keras_attn` that was imported
(not the zoo of another checkout an editable install may point at). It imports nothing.
"""

import importlib.abc
import importlib.util
import os
import sys

NAME = "keras_attn.models"


class ModelsFolderFinder(importlib.abc.MetaPathFinder):
    """Finds `keras_attn.models` in `folder` (its submodules then follow its `__path__`)."""

    def __init__(self, folder):
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME:
            return None
        init = os.path.join(self.folder, "__init__.py")
        return importlib.util.spec_from_file_location(
            fullname, init, submodule_search_locations=[self.folder]
        )


def map_models_folder(package_folder):
    """Maps `keras_attn.models` to `package_folder/../models` in a checkout; else nothing.

    Args:
        package_folder: the folder of the imported `keras_attn` package.

    Returns:
        The finder added (or already there), or None where `keras_attn.models` is installed
        under the package or there is no `models/` beside it.
    """
    if os.path.isdir(os.path.join(package_folder, "models")):
        return None  # installed: keras_attn/models/ is a plain subpackage
    folder = os.path.join(os.path.dirname(os.path.abspath(package_folder)), "models")
    if not os.path.isfile(os.path.join(folder, "__init__.py")):
        return None
    for finder in sys.meta_path:
        if isinstance(finder, ModelsFolderFinder) and finder.folder == folder:
            return finder
    finder = ModelsFolderFinder(folder)
    # First: before an editable install's finder, which maps the name to its own checkout.
    sys.meta_path.insert(0, finder)
    return finder
