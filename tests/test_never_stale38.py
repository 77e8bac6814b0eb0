"""Never stale (issue 28): files that libraries read for the function, ``functools.partial``
objects changed in place, and the miss reasons of issue 27. Every case compares each call with
eager (``torch.equal``) and counts hits, misses, compiles and fallbacks exactly."""

from __future__ import annotations

import configparser
import warnings

import numpy as np
import pytest
import torch

import trident


def _trident_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "trident" in str(w.message)]


# ---- Note [Files read by libraries] (lower/state/recording.py) -------------------------------

def _by_torch_load(path):
    def fn(x):
        return x * torch.load(path / "state.pt")["k"]
    return fn


def _by_configparser(path):
    def fn(x):
        cfg = configparser.ConfigParser()
        cfg.read(path / "model.ini")
        return x * float(cfg["model"]["k"])
    return fn


def _by_numpy(path):
    def fn(x):
        return x * float(np.loadtxt(path / "k.txt"))
    return fn


def _write(path, k: float) -> None:
    torch.save({"k": k}, path / "state.pt")
    (path / "model.ini").write_text(f"[model]\nk = {k}\n")
    (path / "k.txt").write_text(f"{k}\n")


@pytest.mark.parametrize("reader", [_by_torch_load, _by_configparser, _by_numpy],
                         ids=["torch.load", "configparser", "numpy.loadtxt"])
def test_a_file_a_library_reads_is_read_at_every_call(reader, tmp_path):
    """A file that library code opens for the function: its contents are no guard's, so the
    call runs eagerly and reads the file as edited, with one warning."""
    _write(tmp_path, 2.0)
    fn, x = reader(tmp_path), torch.ones(3)
    jf = trident.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in (2.0, 2.0, 5.0, 7.0):
            _write(tmp_path, k)
            assert torch.equal(jf(x), fn(x)), k
    s = jf.stats
    assert (s.hits, s.misses, s.compiles, s.fallbacks) == (0, 4, 0, 4), s
    said = _trident_warnings(caught)
    assert len(said) == 1 and "which opens a file" in said[0], said
