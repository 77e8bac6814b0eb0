"""A decode hit inside ``generate`` against the same hit alone (issue 25).

``python3 -m benchmarks.generate_hits [--archs llama,qwen2] [--layers 2,24]
[--caches static,default] [--device cpu|cuda] [--tokens 24] [--generates 4] [--alone 3]
[--parts] [--thread] [--busy] [--mask]``

Per architecture, depth and cache (tiny random configs of ``sweep_hf.tiny_model``: hidden 64,
batch 1, a 6-token prompt; ``static`` is ``cache_implementation="static"``, ``default`` none:
transformers' ``DynamicCache``; ``--mask``: ``generate`` is given an attention mask of ones, as
a tokenizer's output gives it, which transformers 5.17 reads at every decode step of a
``DynamicCache``: a value check, Note [Value checks]), ``model.forward`` is replaced by a wrapper that ``generate``
calls; greedy ``generate`` calls of ``--tokens`` new tokens then take turns, in one process:

- ``jit``: each decode step through ``trident.jit(model.forward)``, the call timed where
  ``generate`` makes it (**in situ**: ``time.perf_counter_ns`` around the jitted call, after
  ``generate``'s own Python ran since the last step); then, with the same arguments, the cache
  put back to its state before the step each time (outside the timed region), ``--alone``
  calls of the jitted forward (**alone**: the same hit right after itself, as a decode hit
  profiled in a loop), then as many of the eager forward;
- ``eager``: each decode step through the eager forward, timed in situ;
- ``counts`` (one ``generate``, untimed): per call in situ and alone, which pass each root of
  the argument tree took (quiet, unchanged, walked: Note [Unchanged subtrees]) and how the
  state tree's proofs held (through their watchers, by re-reading entries, memo made again);
- ``parts`` (``--parts``): each decode step through ``Dispatcher._hit_profile(..., keep=True)``
  (the hit's parts: state guards, binding, argument tree, environment and leaves, guards, run,
  output rebuild), in situ and alone as above.

The in-situ result is handed to ``generate`` as a copy, the hit's own result dropped before the
alone calls: on CUDA a replay whose handed-out output is still held recaptures (Note [Hand out
after a move] in trident/frontend/graphs.py). On CUDA every alone call waits for the GPU first,
as ``generate``'s calls find it idle after its stopping check (``--busy``: it does not, as in a
profile's loop, where each replay is queued behind the last). Medians over every decode step
(in-situ calls that were not hits are left out and counted); the two jitted calls of a step are
compared in the same process, interleaved, so a loaded machine slows both. ``--thread`` times
the thread's CPU time instead of the wall clock (CPU only). The argument tree's passes per root
(quiet, unchanged, walked) are printed after each case.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch


def _cache(kwargs):
    return kwargs.get("past_key_values", kwargs.get("cache"))


def _snapshot(cache) -> list:
    """What a decode step changes in `cache`: each layer's attributes (a DynamicLayer's tensors
    are replaced by each step) and the values of its small tensors written in place (a
    StaticLayer's ``cumulative_length``); its keys and values written in place are written
    again alike by a call with the same arguments."""
    snap = []
    for layer in getattr(cache, "layers", ()):
        attrs = dict(vars(layer))
        small = [(t, t.clone()) for t in attrs.values()
                 if isinstance(t, torch.Tensor) and t.numel() <= 64]
        snap.append((layer, attrs, small))
    return snap


def _restore(snap) -> None:
    for layer, attrs, small in snap:
        vars(layer).update(attrs)  # (the same objects: no dict changes)
        for t, v in small:
            t.copy_(v)


def _copied(out):
    """`out` (a ModelOutput) with its tensors copied, so that the call's own may be dropped."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if hasattr(out, "keys"):
        return type(out)(**{k: v.clone() if isinstance(v, torch.Tensor) else v
                            for k, v in out.items()})
    return out


class _Counts:
    """Per call: the argument tree's passes per root (``tree_passes``: quiet, unchanged,
    walked) and the state tree's (``_quiet_state``: proofs held through their watchers,
    through a re-read of their entries, memos made), summed over calls."""

    def __init__(self):
        self.calls, self.sums = 0, {}

    def _now(self, jf) -> dict:
        out = {f"tree {k}": v for k, v in jf.tree_passes().items()}
        quiet = jf._quiet_state()
        if quiet is not None:
            made, _, _, reread, watched = quiet
            out["state"] = (watched, reread, made)
        return out

    def of(self, jf):
        import contextlib

        @contextlib.contextmanager
        def counted():
            before = self._now(jf)
            yield
            after = self._now(jf)
            self.calls += 1
            for k, v in after.items():
                d = tuple(x - y for x, y in zip(v, before.get(k, (0,) * len(v))))
                self.sums[k] = tuple(a + b for a, b in zip(self.sums.get(k, (0,) * len(d)), d))

        return counted()


class Steps:
    """``model.forward``'s stand-in: times each decode step as its ``mode`` says."""

    def __init__(self, jf, eager, clock, alone, device, busy=False):
        self.jf, self.eager, self.clock, self.alone = jf, eager, clock, alone
        cuda = device.startswith("cuda") and not busy
        self.sync = torch.cuda.synchronize if cuda else (lambda: None)
        self.mode, self.n, self.snap = None, 0, None
        self.times = {"jit in situ": [], "jit alone": [], "eager alone": [], "eager in situ": []}
        self.parts = {"in situ": [], "alone": []}
        self.counts = {"in situ": _Counts(), "alone": _Counts()}
        self.not_hits = 0

    def _timed(self, fn, args, kwargs):
        start = self.clock()
        out = fn(*args, **kwargs)
        return out, (self.clock() - start) / 1e3

    def __call__(self, *args, **kwargs):
        self.n += 1
        mode = self.mode if self.n > 1 else None  # the prefill: untimed
        fn = self.eager if mode == "eager" else self.jf
        if mode is None:
            out = fn(*args, **kwargs)
        elif mode == "eager":
            out, us = self._timed(fn, args, kwargs)
            self.times["eager in situ"].append(us)
        elif mode == "jit":
            hits = self.jf.hits
            out, us = self._timed(fn, args, kwargs)
            if self.jf.hits == hits + 1:
                self.times["jit in situ"].append(us)
            else:
                self.not_hits += 1
            out = _copied(out)
            for name, f in (("jit alone", self.jf), ("eager alone", self.eager)):
                for _ in range(self.alone):  # back to back, as a profile's loop
                    _restore(self.snap)
                    self.sync()
                    hits = self.jf.hits
                    res, us = self._timed(f, args, kwargs)
                    del res
                    if f is self.eager or self.jf.hits == hits + 1:
                        self.times[name].append(us)
        elif mode == "counts":  # untimed: which passes each call took
            with self.counts["in situ"].of(self.jf):
                out = fn(*args, **kwargs)
            out = _copied(out)
            for _ in range(self.alone):
                _restore(self.snap)
                with self.counts["alone"].of(self.jf):
                    self.jf(*args, **kwargs)  # (its result dropped at once)
        else:  # parts
            thread = self.clock is time.thread_time_ns
            parts, out = self.jf._hit_profile(args, kwargs, 1, thread, True)
            if parts["hits"] == 1:
                self.parts["in situ"].append(parts)
            out = _copied(out)
            for _ in range(self.alone):
                _restore(self.snap)
                self.sync()
                parts = self.jf._hit_profile(args, kwargs, 1, thread)
                if parts["hits"] == 1:
                    self.parts["alone"].append(parts)
        self.snap = _snapshot(_cache(kwargs))  # the next step's state before it
        return out


def run_case(arch: str, layers: int, cache: str, a) -> dict:
    import trident
    from benchmarks.sweep_hf import tiny_model

    model = tiny_model(arch, a.device, layers)
    eager = model.forward
    jf = trident.jit(eager)
    clock = time.thread_time_ns if a.thread else time.perf_counter_ns
    steps = Steps(jf, eager, clock, a.alone, a.device, a.busy)

    def forward(*args, **kwargs):  # a function: the model's tree holds it by identity (the
        return steps(*args, **kwargs)  # Steps object's attributes change at every call)

    model.forward = forward
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (1, 6), device=a.device)
    kw = dict(max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False,
              disable_compile=True)
    if cache != "default":
        kw["cache_implementation"] = cache
    if a.mask:
        kw["attention_mask"] = torch.ones_like(ids)

    def generate(mode):
        steps.mode, steps.n = mode, 0
        return model.generate(ids, **kw)

    reference = None
    for _ in range(3):  # the compiles (prefill, decode step), and the captures on CUDA
        out = generate(None)
        reference = out if reference is None else reference
    generate("counts")
    modes = ("jit", "eager") + (("parts",) if a.parts else ())
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()  # (as no collection runs in a short generate; it would land in one contender)
    differ = []  # (on CUDA a tiny model's greedy tokens may differ: docs/benchmarks.md's sweep)
    try:
        for _ in range(a.generates):
            for mode in modes:
                if not torch.equal(generate(mode), reference):
                    differ.append(mode)
    finally:
        if collecting:
            gc.enable()
    model.forward = eager
    med = {k: statistics.median(v) if v else float("nan") for k, v in steps.times.items()}
    row = {"case": f"{arch}, {layers} layers, {cache} cache", "us": med,
           "calls": {k: len(v) for k, v in steps.times.items()}, "not hits": steps.not_hits,
           "tokens differ": differ,
           "stats": str(jf.stats).split(", miss_reasons")[0], "passes": jf.tree_passes()}
    row["counts"] = {k: (c.calls, c.sums) for k, c in steps.counts.items()}
    if a.parts and steps.parts["in situ"]:
        row["parts"] = {where: {k: statistics.median(p[k] for p in ps) for k in ps[0]
                                if k != "hits" and not (k.startswith("replay") and a.device == "cpu")}
                        for where, ps in steps.parts.items() if ps}
    return row


def report(row: dict) -> None:
    us = row["us"]
    print(f"{row['case']}: µs per call, median ({row['calls']['jit in situ']} decode steps in "
          f"situ, {row['calls']['jit alone']} alone; {row['not hits']} in-situ calls not hits)")
    print(f"  jit in situ {us['jit in situ']:9.1f}   jit alone {us['jit alone']:9.1f}   "
          f"ratio {us['jit in situ'] / us['jit alone']:.2f}")
    print(f"  eager in situ {us['eager in situ']:7.1f}   eager alone {us['eager alone']:7.1f}   "
          f"ratio {us['eager in situ'] / us['eager alone']:.2f}")
    if "parts" in row:
        parts = row["parts"]
        print(f"  {'part':40s} {'in situ':>9s} {'alone':>9s}")
        for k in parts["in situ"]:
            print(f"  {k:40s} {parts['in situ'][k]:9.2f} {parts.get('alone', {}).get(k, 0):9.2f}")
    print(f"  {row['stats']}; generates whose tokens differ from the first: "
          f"{row['tokens differ'] or 'none'}")
    print("  tree passes (quiet, unchanged, walked): " + ", ".join(
        f"{k} {v}" for k, v in row["passes"].items() if any(v)))
    for where, (calls, sums) in row["counts"].items():  # (state: watched, re-read, made)
        print(f"  {where}, {calls} calls: " + ", ".join(f"{k} {v}" for k, v in sums.items()
                                                      if any(v)))


def main(argv=None) -> list:
    import transformers

    p = argparse.ArgumentParser()
    p.add_argument("--archs", default="llama,qwen2")
    p.add_argument("--layers", default="2,24")
    p.add_argument("--caches", default="static,default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--generates", type=int, default=4)
    p.add_argument("--alone", type=int, default=3)
    p.add_argument("--parts", action="store_true")
    p.add_argument("--thread", action="store_true")
    p.add_argument("--busy", action="store_true")
    p.add_argument("--mask", action="store_true")
    a = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, device {a.device}; "
          f"{'thread CPU time' if a.thread else 'wall clock'}")
    rows = []
    try:
        for arch in a.archs.split(","):
            for layers in (int(n) for n in a.layers.split(",")):
                for cache in a.caches.split(","):
                    rows.append(run_case(arch, layers, cache, a))
                    report(rows[-1])
    finally:
        torch.set_num_threads(threads)
    return rows


if __name__ == "__main__":
    main()
