"""PyTorch's OpInfo database (``op_db``) through ``@trident.jit``: every op, float32 and int64,
its first two CPU samples, three calls each; after every call the outputs, the arguments (ops
that write their inputs) and the CPU random generator's state equal eager's bit for bit
(NaN-aware), and no call raises where eager does not.

The test runs a bounded slice (``slice_ops``: ops chosen for the kinds of fault found so far,
plus every 100th op of the database; their first sample). The full sweep is a script::

    TRIDENT_CACHE_DIR=/tmp/tc-opinfo python tests/test_opinfo.py [--out results.jsonl]

or, on a machine with 16 cores, in 16 shards at once, then the summary of all of them::

    for k in $(seq 0 15); do python tests/test_opinfo.py --shard $k/16 --out op-$k.jsonl \
        > op-$k.log 2>&1 & done; wait; python tests/test_opinfo.py --summary op-*.jsonl

It prints the native and fallback shares and the reasons for what runs eagerly
(docs/conformance.md holds the last full run). Each case is classified:

* ``native``: the second and third calls were hits;
* ``fallback``: some call ran eagerly (the reason is Trident's ``miss_reasons``);
* ``different``: a result or an argument differs from eager's (a defect);
* ``crash``: Trident raised where eager did not, or raised another class (a defect).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trident  # noqa: E402
from _trident_helpers import clone_strided, fresh_cache  # noqa: E402

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

DTYPES = (torch.float32, torch.int64)
SAMPLES = 2
CALLS = 3

# The CI slice: ops of the kinds of fault found so far (return_types results, 0-d tensors and
# bools used as scalars, .item(), as_strided with an offset, equal, in-place ops on inputs,
# random ops under a seed the function sets and puts back),
# then every 100th op of the database; the first sample of each.
NAMED = {"max.reduction_with_dim", "sort", "topk", "aminmax", "frexp", "linalg.eigh",
         "full_like", "fill", "item", "as_strided", "equal", "allclose", "index_put", "scatter",
         "masked_fill", "bernoulli", "normal", "nn.functional.dropout", "randint_like"}

# Kinds served natively since they were found (Note [Random state steps], Note [Bool results]):
# these run eagerly in no case of the slice.
NATIVE = {"equal", "allclose", "bernoulli", "normal", "nn.functional.dropout", "randint_like"}


def _case_name(op, dtype) -> str:
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    return f"{name}:{str(dtype).removeprefix('torch.')}"


def cases(ops=op_db):
    """(name, op, dtype, sample index, sample) for every op of ``ops`` on the CPU."""
    for op in ops:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype not in supported:
                continue
            try:
                samples = list(_first(op.sample_inputs("cpu", dtype), SAMPLES))
            except Exception:  # noqa: BLE001 - OpInfo's own generator fails: not a case
                continue
            for i, sample in enumerate(samples):
                yield f"{_case_name(op, dtype)}:{i}", op, dtype, i, sample


def _first(iterable, n):
    for i, x in enumerate(iterable):
        if i == n:
            return
        yield x


def slice_ops():
    return [op for i, op in enumerate(op_db)
            if i % 100 == 0 or _case_name(op, torch.float32).split(":")[0] in NAMED]


def _clone(x):
    """A separate copy of a sample's value (tensors keep sizes and strides)."""
    if isinstance(x, torch.Tensor):
        return clone_strided(x) if x.layout == torch.strided else x.clone()
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def same(got, want, values: bool = True) -> str | None:
    """None when ``got`` equals ``want`` (types, structure, dtypes, shapes, values NaN-aware
    unless not ``values``, Python floats by value with NaN equal to NaN); otherwise what
    differs."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{type(got).__name__} where eager returns a tensor"
        if (got.dtype, got.shape, got.device) != (want.dtype, want.shape, want.device):
            return f"{got.dtype}{list(got.shape)} vs eager {want.dtype}{list(want.shape)}"
        if got.layout != want.layout:
            return f"layout {got.layout} vs eager {want.layout}"
        if not values:
            return None
        g, w = got.detach(), want.detach()
        if g.layout != torch.strided:  # sparse results: their values
            g, w = g.to_dense(), w.to_dense()
        if g.is_complex():
            g, w = torch.view_as_real(g.resolve_conj()), torch.view_as_real(w.resolve_conj())
        if g.dtype.is_floating_point:
            equal = (g == w) | (g.isnan() & w.isnan())
            # -0.0 and 0.0 compare equal: compare signs too
            equal &= (torch.signbit(g) == torch.signbit(w)) | (g.isnan() & w.isnan())
            return None if bool(equal.all()) else "values"
        return None if torch.equal(g, w) else "values"
    if type(got) is not type(want):
        return f"{type(got).__name__} vs eager {type(want).__name__}"
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"keys {list(got)} vs eager {list(want)}"
        got, want = list(got.values()), list(want.values())
    if isinstance(want, (tuple, list)):
        if len(got) != len(want):
            return f"length {len(got)} vs eager {len(want)}"
        for g, w in zip(got, want):
            why = same(g, w, values)
            if why:
                return why
        return None
    if isinstance(want, float) and math.isnan(want):
        return None if math.isnan(got) else "nan"
    return None if got == want else f"{got!r} vs eager {want!r}"


def _run(fn, sample, seed):
    """(result, exception, (args, kwargs) after the call, the CPU generator's state after it)."""
    args = _clone((sample.input, *sample.args))
    kwargs = _clone(dict(sample.kwargs))
    torch.manual_seed(seed)
    try:
        out = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - compared with eager's exception
        return None, e, (args, kwargs), torch.get_rng_state()
    return out, None, (args, kwargs), torch.get_rng_state()


def check_case(op, sample) -> tuple[str, str]:
    """(kind, detail): kind is native, fallback, different, crash or skip (eager raises
    or is nondeterministic)."""
    want, error, want_args, want_rng = _run(op.op, sample, 0)
    if error is not None:
        return "skip", f"eager raises {type(error).__name__}"
    # the empty family returns memory it never wrote: its values are not the op's
    values = "empty" not in op.name
    again, _, _, _ = _run(op.op, sample, 0)
    if same(again, want, values) is not None:
        return "skip", "eager is not deterministic"
    operator = op.op

    def call(*args, **kwargs):
        return operator(*args, **kwargs)

    jf = trident.jit(call)
    for n in range(CALLS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, got_error, got_args, got_rng = _run(jf, sample, 0)
        if got_error is not None:
            return "crash", f"call {n}: {type(got_error).__name__}: {str(got_error)[:300]}"
        why = same(got, want, values) or same(got_args, want_args) or (
            None if torch.equal(got_rng, want_rng) else "the random generator's state")
        if why:
            return "different", f"call {n}: {why}"
    stats = jf.stats
    if stats.fallbacks:
        reasons = [r for r in stats.miss_reasons if r.startswith("eager")]
        return "fallback", reasons[-1] if reasons else "eager"
    return "native", ""


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opinfo_slice_equals_eager(dtype):
    """The bounded slice: no case differs from eager or crashes, and the kinds fixed so far
    (``NATIVE``) are served natively."""
    if torch.cuda.is_available():
        torch.cuda.init()  # Note [Random state steps]: CUDA's lazy seeding runs eagerly
    bad, counts = [], collections.Counter()
    for name, op, case_dtype, index, sample in cases(slice_ops()):
        if case_dtype is not dtype or index > 0:
            continue
        with fresh_cache():
            kind, detail = check_case(op, sample)
        counts[kind] += 1
        if kind in ("different", "crash") or (kind == "fallback" and name.split(":")[0] in NATIVE):
            bad.append(f"{name}: {kind}: {detail}")
    assert not bad, "\n".join(bad)
    assert counts["native"] > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="opinfo-results.jsonl",
                        help="one JSON line per case; an existing file is resumed")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--shard", default="0/1",
                        help="K/N: only the ops whose index is K modulo N (run N at once)")
    parser.add_argument("--summary", nargs="*", help="only summarize these result files")
    parsed = parser.parse_args()
    if parsed.summary:
        summarize([row for p in parsed.summary for row in _read(Path(p))[0].values()])
        return
    out = Path(parsed.out)
    done, running = _read(out)
    with out.open("a") as f:
        if running is not None and running not in done:  # the process died in that case
            row = {"case": running, "kind": "crash", "detail": "the process died"}
            done[running] = row
            f.write(json.dumps(row) + "\n")
        wanted = set(parsed.ops.split(",")) if parsed.ops else None
        k, n = map(int, parsed.shard.split("/"))
        for name, op, _, _, sample in cases(op_db[k::n]):
            if name in done or (wanted and name.split(":")[0] not in wanted):
                continue
            f.write(json.dumps({"case": name, "kind": "running"}) + "\n")
            f.flush()
            try:
                kind, detail = check_case(op, sample)
            except Exception as e:  # noqa: BLE001 - a defect of the check itself
                kind, detail = "crash", f"check: {type(e).__name__}: {e}"[:300]
            done[name] = {"case": name, "kind": kind, "detail": detail}
            f.write(json.dumps(done[name]) + "\n")
            f.flush()
            print(f"{kind:9} {name} {detail[:150]}", flush=True)
    summarize(done.values())


def _read(path: Path) -> tuple[dict, str | None]:
    """The finished cases of a result file, and the case its process was running when it
    stopped (None if it finished it)."""
    done, running = {}, None
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["kind"] == "running":
                running = row["case"]
            else:
                done[row["case"]] = row
                running = None if running == row["case"] else running
    return done, running


def summarize(rows) -> None:
    rows = [r for r in rows if r["kind"] != "skip"]
    counts = collections.Counter(r["kind"] for r in rows)
    total = len(rows)
    print(f"{total} cases where eager works: " + ", ".join(
        f"{k} {v} ({100 * v / total:.1f}%)" for k, v in counts.most_common()))
    reasons = collections.Counter()
    for r in rows:
        if r["kind"] != "native":
            reasons[(r["kind"], r["detail"][:120])] += 1
    for (kind, detail), n in reasons.most_common():
        print(f"{n:4} {kind:9} {detail}")


if __name__ == "__main__":
    main()
