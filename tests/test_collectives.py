"""Collectives inside a Trident function (Note [Collectives], Note [Process group guard] in
trident/lower/collectives.py): two gloo ranks on the CPU, started with torch.multiprocessing; each
rank compares every result with the same program run eagerly (tests/_tp_worker.py)."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import _tp_worker

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(tmp_path, worker=_tp_worker.run) -> list[dict]:
    port = _free_port()  # and port + 1, port + 2 for the groups of one
    cache = os.environ["TRIDENT_CACHE_DIR"]
    mp.spawn(worker, args=(WORLD, port, cache, str(tmp_path)), nprocs=WORLD)
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(WORLD)]


def test_two_ranks(tmp_path):
    for rank, r in enumerate(_ranks(tmp_path)):
        # functional all_reduce / all_gather / reduce_scatter, in-place dist.all_reduce (SUM and
        # MAX), all_gather_into_tensor, reduce_scatter_tensor: native, equal to eager per rank
        assert r["collectives_equal"] == [True] * 3, rank
        assert (r["collectives"]["hits"], r["collectives"]["compiles"]) == (2, 1), r["collectives"]
        assert r["collectives"]["fallbacks"] == 0
        source = r["collectives_source"]
        for op in ("all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor",
                   "wait_tensor"):
            assert f'"_c10d_functional::{op}"' in source, op
        assert "c10d::allreduce_" not in source
        # under torch.compile(backend="trident"): one graph, served natively
        assert r["compile_equal"] == [True] * 3
        assert [(g["hits"], g["compiles"], g["fallbacks"]) for g in r["compile"]] == [(2, 1, 0)]
        # the tensor-parallel decode step
        assert r["tp_equal"] == [True] * 3
        assert (r["tp"]["hits"], r["tp"]["compiles"], r["tp"]["fallbacks"]) == (2, 1, 0)
        # the rank read while tracing is guarded: each rank compiled its own specialization
        assert r["scaled_equal"] and r["scaled"]["compiles"] == 1
        # another group: eager, with one warning
        assert r["subgroup_equal"] and r["subgroup"]["fallbacks"] == 1
        # (the global that holds the group is found first: Note [State guards] in
        # trident/lower/state/__init__.py)
        (warning,) = r["subgroup_warnings"]
        assert "default group" in warning or "global SUBGROUP is a" in warning, warning
        # a peer that leaves: the collective raises at once, with the user's line
        if rank == 0:
            kind, message = r["peer_gone"]
            assert kind == "TridentError" and message.startswith("_tp_worker.py:"), message
            assert "Connection closed by peer" in message, message
        # a group of another size: a miss on the process group guard, then served natively
        # (compiled, or the other rank's specialization for the same group found on disk)
        assert r["alone_equal"]
        assert (r["alone"]["misses"], r["alone"]["fallbacks"]) == (2, 0), r["alone"]
        assert ("the default process group is '0', rank %d of 2 expected, but the default "
                "process group is '0', rank 0 of 1" % rank) in r["alone"]["miss_reasons"][-1]
        # no group: eager's exception, after one warning
        got, want = r["no_group_error"]
        assert got == want
        assert r["no_group"]["fallbacks"] == 1 and len(r["no_group_warnings"]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} GPUs")
def test_two_gpus_nccl_graphs(tmp_path):
    for rank, r in enumerate(_ranks(tmp_path, _tp_worker.run_cuda)):
        assert r["collectives_equal"] == [True] * 4, rank
        assert (r["collectives"]["hits"], r["collectives"]["fallbacks"]) == (3, 0)
        # the decode step: step by step, then captured with its NCCL collectives and replayed
        assert r["tp_equal"] == [True] * 4, rank
        assert (r["tp"]["hits"], r["tp"]["fallbacks"]) == (3, 0), r["tp"]
        assert (r["tp"]["graph_captures"], r["tp"]["graph_replays"]) == (1, 3), r["tp"]
