"""What the ``backend="trident"`` door tells Dynamo of a frame's sizes: its record of the sizes
it saw (``torch._dynamo.pgo``'s frame state, which ``mark_dynamic`` and automatic dynamic feed),
so that the frame's later graphs are symbolic where a server's calls change (backend.py hands
each graph over; Dynamo's guards stay the graphs' own).

Note [Door batch dims]: Dynamo makes a dim symbolic only once it saw it change (automatic
dynamic), tensor by tensor, so a server's prefill and decode step each became three graphs:
exact sizes, the lengths symbolic (batch 2 still a constant of the graph's code), then the
lengths and the batch (``sweep_hf llama 10 static backend``: 6 graphs, each compiled by
Trident). ``trident.jit`` makes the batch dims symbolic together with the lengths (Note [Batch
dims] in batch.py); the door does the same through Dynamo's own record of the sizes it saw
(``torch._dynamo.pgo``'s frame state, which ``mark_dynamic`` and automatic dynamic feed): when it
compiles a graph, it records dim 0 of the graph's batch tensors (the first tensor input that is
no parameter or buffer, of 2 or more rows, and every other such input of that dim 0) as dynamic
for that frame. The graph itself is already traced and keeps its sizes; the frame's next graph,
which Dynamo traces only when a guard of the earlier ones failed (a new length or batch), has
the batch symbolic with the lengths that changed. So the prefill and the decode step are two
graphs each (4 Trident compiles for the sweep). Dynamo's guards are the new graph's, so this
changes what is traced, never what a graph accepts. A batch of one still gets graphs of its
own: Dynamo specializes a size 1 (a symbol's range is 2 and up). The record is per process
(persisted only under ``TORCH_COMPILE_JOB_ID``, Dynamo's profile-guided mode).

Note [Tied dims]: automatic dynamic decides per source, and a source Dynamo never saw is static.
A new argument structure that ties a new tensor to a dim that changed before is then traced at
the new tensor's size: a transformers padded prefill after unpadded calls (``attention_mask``, a
new input of ``[batch, prompt]``, static, against ``input_ids``' prompt length, dynamic since
the decode step) has ``input_ids.size(1)`` a symbol that a guard replaced by the mask's 498
(Qwen2), or a symbol whose graph guards the mask's static size (Gemma 2's sliding layers slice
the mask), so Dynamo's graph is of that prompt length only (and of batch 2: its batch is
recorded dynamic only after it), and the next padded prompt made the same graph again, symbolic
(``sweep_hf qwen2 N default backend padded 0 1``: 7 compiles of 8 graphs, Dynamo's
``recompile_limit``). So before a graph is compiled, ``untie`` takes the values (2 or more) of
the dims other than 0 of its tensor inputs (no parameter or buffer) that Dynamo made symbolic (a
``SymInt`` of the graph's fake: the constant a guard replaced it by, or its hint), and the
static dims other than 0 of those sizes of the graph's other such inputs whose dims other than 0
Dynamo never saw change (a new input: a cache's keys, whose length changed and whose 2 key heads
did not, are not taken for a decode step's length of 2); it records those as dynamic in the
frame state, with the graph's batch dims (dims 0 are Note [Door batch dims]'s), and has Dynamo
trace the frame again (``TensorifyScalarRestartAnalysis``, the one restart that Dynamo's call of
a backend lets through: torch 2.13's ``OutputGraph``, and an earlier 2.x's source read; 2.11 not
run): the mask's dim is symbolic with the prompt's, the batch too, and the padded prefill is one
graph. Each restart records at least one dim more, so the restarts of a frame are at most its
inputs' dims; a size that is a constant of the code stays one, with no further restart, and a
coincidence of sizes costs one retrace. A tie other than of equal sizes (a decode step's mask,
one longer than the cache) is not found. Dynamo's retrace costs what its first trace did
(seconds for a model on the CPU); the Trident compile and the Dynamo graph it saves cost more.
As above, this changes what Dynamo traces, never what a graph accepts: Dynamo's guards are the
retraced graph's.

Note [Stored lengths in graphs]: the door's side of Note [Lengths of written state] (ints.py).
A frame that stores tensors into the attributes of objects that outlive it (Dynamo's side
effects on an object of a source: a transformers ``DynamicCache``'s prefill sets its layers'
``keys`` and ``values``, which were None) stores lengths a server's next calls change, and
Dynamo traced it at exact sizes: the prefill, its decode step (whose keys, a source Dynamo had
not seen, were static) and the decode step again at the next cache length, the prefill again
at the next prompt (a new user's ``generate`` calls of batch and prompt (1, 6), (1, 9), (1,
20), (2, 7), (1, 13): 6 graphs, 6 compiles; tests/test_serve48.py). So before a graph is
compiled, ``untie`` also takes as lengths the sizes (2 or more) of the dims other than 0 of
the tensors stored where the object held none (but an int attribute the object holds: a
capacity, as a static cache's ``max_cache_len``, sizes a buffer of its own), and, where the
object held a tensor, records the dims the store changes (sizes 2 or more: a decode step's
cache grown by one, whose prefill Dynamo did not compile) as dynamic; the free inputs' static
dims of those lengths are recorded as Note [Tied dims] records its ties, and Dynamo traces the
frame again. And when a graph is compiled, ``record_stored_dims`` records as dynamic, at each
path a tensor is stored, the dims stored symbolic, so the frame's next graph that reads them
(the decode step) is symbolic from its first trace. That sequence is then 4 graphs: the
prefill and the decode step, symbolic, for a batch of one and for others (Dynamo specializes
a size 1, so a batch of one met first is graphs of its own; met after, it is served by the
symbolic graphs: Note [Graphs of constants] in backend.py). A size of 1 is no length here
(Dynamo specializes it whatever the frame state says). A size stored by coincidence (a
prompt as long as the key heads) is recorded too and costs one retrace, as a tie does.

Note [Restarts take another path]: a frame traced again with a dim symbolic may take another
path through its bytecode than the first trace (a buffer of a literal size 6 filled by
``buf[:, :ids.shape[1]] = ids`` where the prompt has 6 tokens: the first trace's slice was
static). Dynamo replays the decisions its first trace logged at each instruction that might
break the graph (its ``speculation_log``) and raised ``SpeculationLogDivergence`` to the
caller where the retrace differs, a crash of the user's call. Before raising the restart the
door clears that log, as Dynamo does itself before its own restart on a changed int
(``UnspecializeRestartAnalysis``, torch 2.11-2.13's ``convert_frame``): a graph break the
first trace found is found again by the retrace, and the door's restarts stop when no dim is
left to record (tests/test_serve48.py).
"""

from __future__ import annotations

import inspect

import torch
import torch.fx as fx

from trident import config


def _name(source) -> str | None:
    """A Dynamo source's name (``L['x']``: a property in torch 2.13, a method before), or None
    (no source, or one that has none: a ``TempLocalSource``)."""
    try:
        name = getattr(source, "name", None)
        name = name() if callable(name) else name
    except NotImplementedError:
        return None
    return name if isinstance(name, str) else None


def source(node: fx.Node) -> str | None:
    """The name of the source of a Dynamo graph's placeholder (``L['x']``), or None."""
    return _name(getattr(node.meta.get("grapharg"), "source", None))


def _entries(tx) -> dict:
    """The frame state of ``tx``'s frame: ``{source name: FrameStateSizeEntry}``."""
    from torch._dynamo import pgo

    # torch 2.11's CodeId.make takes the code; 2.13's the closure too
    closure = (tx.closure,) if "closure" in inspect.signature(pgo.CodeId.make).parameters else ()
    return pgo.get_code_state()[pgo.CodeId.make(tx.f_code, *closure)].automatic_dynamic


def _free_inputs(gm: fx.GraphModule, examples: list) -> list:
    """``(source name, example tensor)`` of the graph's tensor inputs of one or more dims that
    are no parameter or buffer (``examples``: the backend's example inputs, or the
    placeholders' fakes)."""
    free = []
    for node, example in zip([n for n in gm.graph.nodes if n.op == "placeholder"], examples):
        name = source(node)
        if isinstance(name, str) and isinstance(example, torch.Tensor) and example.dim() and \
                not isinstance(example, torch.nn.Parameter) and "._buffers[" not in name \
                and "._parameters[" not in name:
            free.append((name, example))
    return free


def record_batch_dims(tx, gm: fx.GraphModule, example_inputs: list) -> None:
    """Note [Door batch dims]: record dim 0 of the graph's batch tensors as dynamic in the
    frame state Dynamo merges its next graph's sizes with."""
    if not torch._dynamo.config.automatic_dynamic_shapes:
        return
    free = [(name, t.shape[0]) for name, t in _free_inputs(gm, example_inputs)]
    names = [name for name, rows in free if rows == free[0][1] >= 2]
    if len(names) < 2:  # a batch is a dim 0 of 2 or more rows that tensors share
        return
    from torch._dynamo import pgo

    entries = _entries(tx)
    for name in names:
        entry = entries.get(name)
        if entry is not None and isinstance(entry.size, tuple) and entry.size:
            entry.size = (pgo.auto_dynamic, *entry.size[1:])


def _stores(tx) -> list[tuple[str, torch.Tensor, object, dict]]:
    """Note [Stored lengths in graphs]: ``(source name, fake, held, the object's __dict__)`` of
    each tensor the frame stores as an attribute of an object that existed before it (Dynamo's
    side effects of an object of a source: ``L['kwargs']['cache'].layers[0].keys``), ``held``
    the value the object holds there now, before the graph runs (None where it has none)."""
    stores = []
    for var, attrs in tx.output.side_effects.store_attr_mutations.items():
        base = _name(getattr(var, "source", None))
        held = getattr(getattr(var, "value", None), "__dict__", None)
        if base is None or not isinstance(held, dict):
            continue  # an object made in the frame, or one without a __dict__
        for attr, value in attrs.items():
            fake = getattr(getattr(value, "proxy", None), "node", None)
            fake = fake.meta.get("example_value") if fake is not None else None
            if isinstance(fake, torch.Tensor) and isinstance(attr, str):
                stores.append((f"{base}.{attr}", fake, held.get(attr), held))
    return stores


def record_stored_dims(tx) -> None:
    """Note [Stored lengths in graphs]: record as dynamic, at each path where the frame stores
    a tensor, the dims it stores symbolic, for the frame's next graphs that read it back."""
    if not torch._dynamo.config.automatic_dynamic_shapes:
        return
    from torch._dynamo import pgo

    entries = _entries(tx)
    for name, fake, _, _ in _stores(tx):
        size = tuple(pgo.auto_dynamic if _constant(n) is None else _constant(n)
                     for n in fake.shape)
        if pgo.auto_dynamic not in size:
            continue
        entry = entries.get(name)
        if entry is None or not isinstance(entry.size, tuple) or len(entry.size) != len(size):
            entries[name] = pgo.FrameStateSizeEntry(size=size)
        else:
            entry.size = tuple(pgo.auto_dynamic if n is pgo.auto_dynamic else m
                               for n, m in zip(size, entry.size))


def _stored_lengths(stores: list) -> tuple[set[int], dict[str, list[int]]]:
    """Note [Stored lengths in graphs]: the sizes (2 or more; dims other than 0) of the tensors
    stored where the object held none, but for an int attribute the object holds (a capacity);
    and by path, the dims of a held tensor (2 or more) that the store changes."""
    sizes, changed = set(), {}
    for name, fake, held, attrs in stores:
        if isinstance(held, torch.Tensor):
            if held.dim() == fake.dim():
                dims = [d for d, (n, h) in enumerate(zip(fake.shape, held.shape))
                        if _constant(n) not in (None, h) and h >= 2]
                if dims:
                    changed[name] = dims
            continue
        if held is None:
            capacities = {v for v in attrs.values() if type(v) is int}
            sizes |= {_constant(n) for n in fake.shape[1:]} - capacities
    return sizes - {None, 0, 1}, changed


def _constant(n) -> int | None:
    """``n``'s value where it is an int, or a SymInt its ShapeEnv replaced by a constant (asks
    no guard); None for a symbolic one."""
    if type(n) is int:
        return n
    node = n.node
    env = getattr(node, "shape_env", None)
    expr = env.replace(node.expr) if env is not None else node.expr
    return int(expr) if expr.is_Integer else None


def _value(n: torch.SymInt) -> int | None:
    """``n``'s constant, or the hint of a symbolic one (asks no guard)."""
    value = _constant(n)
    return value if value is not None else getattr(n.node, "hint", None)


def untie(tx, gm: fx.GraphModule, example_inputs: list) -> None:
    """Note [Tied dims]: record as dynamic the static dims of the graph's new free tensor
    inputs whose size is that of a dim Dynamo made symbolic or a length the frame stores (Note
    [Stored lengths in graphs]), and have Dynamo trace the frame again; returns where there
    are none (or Dynamo's frame state or its
    restart is not there: torch's private API moved).

    Raises:
        torch._dynamo.exc.TensorifyScalarRestartAnalysis: dims were recorded; Dynamo catches
            it and traces the frame again."""
    restart = getattr(torch._dynamo.exc, "TensorifyScalarRestartAnalysis", None)
    if restart is None or not torch._dynamo.config.automatic_dynamic_shapes:
        return
    from torch._dynamo import pgo

    # the graph's own fakes: example_inputs hold the hints of its symbolic dims
    fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    entries, free = _entries(tx), _free_inputs(gm, fakes)
    # dims other than 0: a batch is Note [Door batch dims]'s (recorded before the restart)
    sizes = {_value(n) for _, t in free for d, n in enumerate(t.shape)
             if d and isinstance(n, torch.SymInt)} - {None, 0, 1}
    # Note [Stored lengths in graphs]: the lengths of the state the frame stores
    stored, changed = _stored_lengths(_stores(tx))
    sizes |= stored
    marked = []
    for name, t in free:
        entry = entries.get(name)
        if entry is None or not isinstance(entry.size, tuple) or len(entry.size) != t.dim():
            continue
        if any(type(n) is not int for n in entry.size[1:]):
            continue  # a tensor whose other dims changed while this one did not: not a length
        dims = {*changed.get(name, ()),  # a held tensor the frame grows
                *(d for d, n in enumerate(t.shape) if d and _constant(n) in sizes)}
        dims = sorted(d for d in dims if type(entry.size[d]) is int)
        if dims:
            entry.size = tuple(pgo.auto_dynamic if d in dims else n
                               for d, n in enumerate(entry.size))
            marked.append(f"{name} dims {dims}")
    if marked:
        record_batch_dims(tx, gm, example_inputs)  # the retraced graph's batch too
        reason = f"tied dims recorded dynamic: {', '.join(marked)}"  # stored lengths too
        config.logger("recompiles").info("%s: Dynamo traces the frame again", reason)
        # Note [Restarts take another path]
        log = getattr(tx, "speculation_log", None)
        if log is not None:
            log.clear()
        raise restart(restart_reason=reason)

