"""State guards: what a function reads outside its arguments, checked natively on every call.

Note [State guards]: a trace bakes in every Python value the function reads that is not an
argument: a global ``SCALE``, ``Knobs.factor``, ``GAIN[0]``, ``cfg.SCALE``, a closure's list, a
default, ``os.environ.get("MODE")``, a helper's code, a Triton kernel's ``tl.constexpr`` global.
Each such read becomes a **chain** (as Dynamo's sources: a root, then attribute, item and
closure-cell accessors), found in two steps:

1. :func:`record` (recording.py) watches the trace with ``sys.setprofile``: every function of
   user code that runs (the function, the helpers and methods it calls, in any module and at
   any depth; not the standard library, installed packages or Trident: Note [User code] in
   trident/frames.py) and every call of a function whose result no guard can keep
   (``random.random()``, ``time.time()``, ``torch.default_generator.initial_seed()``: Python's
   random state, a ``torch.Generator``'s, the clock, the OS), which make the call run eagerly.
2. :func:`reads_of` (reads.py) reads the bytecode of each function that ran (and of each user
   Triton kernel it launches) for chains (``_chains`` in bytecode.py): ``LOAD_GLOBAL`` /
   ``LOAD_DEREF`` of a closure cell / an ``import`` inside the function, then ``LOAD_ATTR`` /
   ``LOAD_METHOD`` / a constant subscript / ``.get(constant)`` / ``"k" in d`` / ``type(v)`` /
   ``getattr(v, constant)``; ``globals()[...]`` and ``os.getenv(constant)`` too; a local
   bound to a chain continues it where it is loaded; a parameter's attribute that its class
   holds (``self.factor``, ``type(self).K``, ``cls.s``) is read through the value's own class
   (its MRO, in C); an item that no constant names (a loop's, a comprehension's,
   ``layers[i]``) is the step ``EACH``, read through every item the container holds (Note
   [Items reached by iteration] in instances.py), and a parameter through every set of objects
   the code ran with (Note [Calls of the same code] in recording.py). Every instruction of a
   function that ran counts, taken or not, so a branch the next call takes is guarded too.
   A read the scan sees but cannot follow
   (``getattr`` with a computed name, ``globals()[name]``) makes the call eager: no read is
   assumed constant.

:func:`build` (tree.py) evaluates the chains (:class:`Read`, chain.py) now and makes a **state
tree**: the argument tree's nodes (flatten.py) under roots (a module, the function,
``builtins``), read in C by ``getattr`` / ``getitem`` / a cell's contents, each checked like
Dynamo's guard kinds:

* ``ID`` (ID_MATCH): modules, classes, functions (their code runs, so their own reads are
  chains of their own), builtins, Triton kernels;
* ``CONST`` (EQUALS_MATCH): numbers (floats by bit pattern), str, bytes, None, dtypes;
* ``TENSOR``: a tensor's identity, its version counter (a version tag: an in-place write
  bumps it) and its contents against a copy (a write through ``.data`` bumps none: Note
  [Global tensor values] in tree.py), for a global CPU tensor read as Python values
  (``.tolist()``, ``.item()``);
* ``TYPE``: the exact type of a container or object a chain goes through;
* ``ABSENT``: a name that must stay unbound (a global that would shadow the builtin ``abs``);
* a value used whole (a list iterated, a config passed on): its whole contents, as an argument
  tree checks an argument (SEQ, DICT, OBJECT, CONST ...). Values whose contents no check sees
  (numpy arrays, locks, an object with ``__slots__``) make the call run eagerly, with a warning.

Reads by the standard library's and installed packages' own code are not chains (their code
and module state are taken as fixed), but for the functions, classes and modules that the
library code the function ran loads from its globals, checked by identity (Note [Library code
that ran] in library.py), and the immutable values it loads so, checked by value (Note
[Library values] in library.py); what user code reads from them is a chain (Note [Library
state] in tree.py); torch's global flags that ops obey are call-wide guards instead
(``trt_env.flags`` in guards.py).

Writes outside the arguments are the other half (Note [Write targets] in flow.py): read from
the bytecode before the trace, and for a user function the trace reaches through a callee the
bytecode does not name, when its frame starts (Note [Writes at entry] in writes.py), so that a
call that runs eagerly writes once; library code's writes to its own state are watched as they
are about to run (Note [Library code that writes its state] in library_writes.py).

The dispatcher evaluates the union of its specializations' state trees before every call
(``state_holds`` in runtime/dispatcher.cpp). When a check fails the call goes to Python, which
evaluates each stored specialization's chains again and installs only those whose **digest** (a hash of
every node's contents, by value: floats by bit pattern, functions by their code, tensors by
their bytes) equals the one stored with it; the others stay on disk for the state they were
compiled in. The digest is also what makes a stored specialization valid in another process.
"""

from trident.lower.state.asked import raise_asked
from trident.lower.state.chain import Read
from trident.lower.state.tensor_reads import check_questions
from trident.lower.state.reads import reads_of
from trident.lower.state.hooks import pause, paused, resumed, unrecorded
from trident.lower.state.recording import Recording, record
from trident.lower.state.tree import StateTree, build
from trident.lower.state.warned import given as given_warnings, raise_given
from trident.lower.state.writes import check_write, check_writes_before_trace

__all__ = ["Read", "Recording", "StateTree", "build", "check_questions", "check_write",
           "check_writes_before_trace", "given_warnings", "pause", "paused", "raise_asked",
           "raise_given", "reads_of", "record", "resumed", "unrecorded"]
