"""A pytest session without ``TRIDENT_TEST_RUNTIME_CACHE`` links the runtime the user's cache
already holds (a fresh user's first two test files rebuilt it: 777 s on a loaded machine)."""

from __future__ import annotations

import shutil

from conftest import reuse_users_runtime
from trident import runtime


def test_the_users_runtime_is_linked_not_built(tmp_path, monkeypatch):
    built = runtime.load().__file__  # the session's runtime, as the user's cache would hold it
    users = tmp_path / "users-cache"
    (users / "runtime").mkdir(parents=True)
    key = runtime.build_key()
    shutil.copytree(runtime.Path(built).parent, users / "runtime" / key)
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(users))
    session = tmp_path / "session"
    session.mkdir()
    assert reuse_users_runtime(session) == users / "runtime" / key
    link = session / "runtime" / key
    assert link.is_symlink() and link.resolve() == (users / "runtime" / key).resolve()
    assert runtime._intact(link)
    shutil.rmtree(session)  # the session's end (pytest_unconfigure) removes the link only
    assert runtime._intact(users / "runtime" / key)


def test_no_intact_runtime_in_the_users_cache_links_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(tmp_path / "empty"))
    assert reuse_users_runtime(tmp_path) is None
    assert not (tmp_path / "runtime").exists()
