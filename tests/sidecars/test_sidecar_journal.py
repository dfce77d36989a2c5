"""The load journal on a real folder: overrides and uploaded files come back as they were
loaded, uploads stay inside the journal's folder, and an unload forgets both."""

from __future__ import annotations

import shutil
from pathlib import Path

from protos import model_config_pb2 as mc
from sidecars.journal import LoadJournal

FILES = {"1/model.onnx": b"onnx bytes", "labels.txt": b"a\nb\n"}


def _journal(folder: Path) -> LoadJournal:
    return LoadJournal.beside(str(folder / "lane.sock"))


def test_loads_come_back_with_their_override_and_files(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.loaded("from_repository", None)
    journal.loaded("uploaded", mc.ModelConfig(name="uploaded", max_batch_size=8), FILES)
    replays = _journal(tmp_path).entries()  # as a restarted sidecar reads it
    assert replays["from_repository"].override is None and replays["from_repository"].files is None
    uploaded = replays["uploaded"]
    assert uploaded.override is not None and uploaded.override.max_batch_size == 8
    assert uploaded.files == FILES
    # One folder, named by a digest of the model's name, under the journal's own folder.
    (kept,) = (tmp_path / "uploads").iterdir()
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted(FILES)


def test_unload_and_a_reload_from_the_repository_forget_the_files(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.loaded("a", mc.ModelConfig(name="a"), FILES)
    journal.loaded("b", mc.ModelConfig(name="b"), FILES)
    journal.unloaded("a")
    journal.loaded("b", None)  # reloaded from the repository
    assert _journal(tmp_path).entries() == {"b": journal.entries()["b"]}
    assert list((tmp_path / "uploads").iterdir()) == []


def test_a_path_outside_the_model_folder_is_never_written(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal")
    (tmp_path / "journal").mkdir()
    journal.loaded("evil", mc.ModelConfig(name="evil"), {"../../escaped": b"x", "1/model.onnx": b"y"})
    assert not (tmp_path / "escaped").exists()
    assert not any(p.name == "escaped" for p in tmp_path.rglob("*"))
    assert "evil" not in _journal(tmp_path / "journal").entries()  # not replayed without its files


def test_files_that_went_missing_replay_as_none(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.loaded("gone", mc.ModelConfig(name="gone"), FILES)
    shutil.rmtree(tmp_path / "uploads")
    # No files: its load fails and the sidecar forgets it, as for a repository model gone.
    assert _journal(tmp_path).entries()["gone"].files == {}


def test_an_unsupervised_sidecar_remembers_nothing(tmp_path: Path) -> None:
    journal = LoadJournal.beside("")
    journal.loaded("uploaded", mc.ModelConfig(name="uploaded"), FILES)
    assert journal.entries() == {}
    assert list(tmp_path.iterdir()) == []
