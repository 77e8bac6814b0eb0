"""The module of each installed specialization: loaded by the name stored with it, or rendered
and built (or found built), then initialised (its cubins, its interpreter callbacks); and the
modules no stored specialization names any more, pruned. Which specializations are installed,
and in what order, is the installer's (install.py).

Note [Stored module names]
~~~~~~~~~~~~~~~~~~~~~~~~~~
A module's name hashes its rendered C (Note [Build key] in build.py), so a new process rendered
every specialization it installed only to learn which module to load: Trident's largest part
of a warm restart (a 16-layer Llama's two graphs through the backend door: render 0.17 of 0.44
CPU seconds on the CPU machine; docs/benchmarks.md, "Session of 2026-12-07 (ninth)"). What the
name depends on besides the specialization is Trident's source and templates, the runtime's
headers, the C flags and Python, all in the function key (Note [Function key]), so the folder
fixes them; and the function's name (which render writes into the C), cffi's and Jinja2's
versions: the ``context``. So once a stored specialization's module is built or found by
rendering, ``modules/<spec key>-<context>.json`` in the function's folder records the module's
name, its callback slots (the step each one launches) and its cubins by SHA-256 (the bytes are
the specialization's own, ``TritonStep.binary``), and a later process loads that module
without rendering where its file is intact (build.py's digest) and each cubin is one of the
specialization's. Anything else (no record, a damaged one, the module deleted or damaged, a
cubin it lacks) renders, builds where needed and records it again, as before. A record is
written only for a specialization stored on disk (a process-only one's would name nothing a
later process finds: Note [Process-only state] in install.py) and deleted with it
(``FunctionCache.save_spec``'s trimming) or its folder (Note [Cache size]). ``source()``, the
``code`` log and pruning's names render on demand (pruning reads the records first).
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from pathlib import Path
from typing import Callable

import cffi
import jinja2

from trident import build, config, runtime
from trident.codegen import render as codegen
from trident.errors import TridentError
from trident.ir.plan import TritonStep
from trident.ir.specialization import Specialization
from trident.lower import kernels

_code_log = config.logger("code")


class Modules:
    """The JitFunction methods that make, load and prune the modules of specializations; the
    state they keep lives in the Dispatcher's ``__dict__`` (``JitFunctionMixin._setup``)."""

    __slots__ = ()

    def _render(self, spec: Specialization, stage: bool = True) -> codegen.Rendered:
        """``spec``'s module source; rendered once while installed. Counted as the ``render``
        stage of Note [Compile stages] in config.py unless ``stage`` is False (``source()``:
        a render that shows the C, not one that makes or finds a module)."""
        rendered = self._rendered.get(spec.key)
        if rendered is not None:
            return rendered
        if not stage:
            return codegen.render(spec, self.__qualname__)
        with config.stage("render"):
            return codegen.render(spec, self.__qualname__)

    def _load_modules(self, specs: list[Specialization]) -> None:
        """The modules of ``specs`` (one loaded stays: Note [Installing on demand] in
        install.py) into ``self._modules``, in guard order; the renders of ``specs`` kept.

        Raises:
            TridentError: no runtime (``explain()`` and ``source()`` say why), a module that
                does not build, or one built for another runtime ABI."""
        if self._no_runtime is not None:
            raise TridentError(self._no_runtime)
        self._rendered = {s.key: self._rendered[s.key] for s in specs if s.key in self._rendered}
        if _code_log.isEnabledFor(logging.INFO):  # each new one's C, recorded or not
            for spec in specs:
                if spec.key not in self._rendered:
                    self._rendered[spec.key] = self._render(spec)
                    _code_log.info("%s", self._rendered[spec.key].source)
        self._modules = {s.key: self._modules.get(s.key) or self._load_module(s)
                         for s in specs}

    def _load_module(self, spec: Specialization):
        """``spec``'s module, found by its stored name (Note [Stored module names]) or rendered
        and built (or found in the cache), its operators looked up, its cubins and Python
        callbacks handed over."""
        found = self._stored_module(spec)
        if found is None:
            rendered = self._rendered[spec.key] = self._render(spec)
            module = build.build(rendered.sources, self._cache.directory)
            callbacks, cubins = rendered.callbacks, rendered.cubins
            if self._cache.stored(spec.key):
                self._record_module(spec, module.__name__, rendered)
        else:
            module, callbacks, cubins = found
        rt = runtime.load()
        rc = module.lib.scm_init(rt.api_address())
        if rc < 0:
            raise TridentError(f"{self.__qualname__}: the module was built for another version "
                               "of the runtime's ABI (trident_rt.h)")
        if rc > 0:
            raise TridentError(f"{self.__qualname__}: the runtime lacks an operator the module "
                               f"calls (op table entry {rc - 1})")
        for index, cubin in enumerate(cubins):
            if module.lib.scm_set_cubin(index, cubin, len(cubin)):
                raise TridentError(f"{self.__qualname__}: cannot hand cubin {index} over to "
                                   "its module (out of memory)")
        for slot, step_index in enumerate(callbacks):
            key = (spec.key, step_index)
            if key not in self._callback_ids:
                launch = spec.plan.steps[step_index].launch
                launcher = kernels.interpreted_launcher(
                    kernels.find_kernel(launch.ref, self._code_fn), launch,
                    _weakly(self._count_interpreted))
                self._callback_ids[key] = rt.register_callback(launcher)
            module.lib.scm_set_callback(slot, self._callback_ids[key])
        return module

    def _module_context(self) -> str:
        """Note [Stored module names]: what a module's name depends on that the function's
        folder does not fix."""
        words = f"{self.__qualname__}|cffi {cffi.__version__}|jinja2 {jinja2.__version__}"
        return hashlib.sha256(words.encode()).hexdigest()[:16]

    def _stored_module(self, spec: Specialization) -> tuple | None:
        """Note [Stored module names]: (module, callback slots, cubins) of ``spec``'s recorded
        module, loaded, or None where it must be rendered."""
        record = self._cache.load_module_record(spec.key, self._module_context())
        if record is None:
            return None
        binaries = {hashlib.sha256(s.binary.cubin).hexdigest(): s.binary.cubin
                    for s in spec.plan.steps if isinstance(s, TritonStep) and s.binary}
        if not set(record["cubins"]) <= binaries.keys() or any(
                not 0 <= i < len(spec.plan.steps) for i in record["callbacks"]):
            return None
        module = build.load_built(record["module"], self._cache.directory)
        if module is None:
            return None
        return module, record["callbacks"], [binaries[c] for c in record["cubins"]]

    def _record_module(self, spec: Specialization, name: str,
                       rendered: codegen.Rendered) -> None:
        """Note [Stored module names]: record that the stored ``spec``'s module is ``name``."""
        self._cache.save_module_record(spec.key, self._module_context(), {
            "module": name, "callbacks": list(rendered.callbacks),
            "cubins": [hashlib.sha256(c).hexdigest() for c in rendered.cubins]})
        self._module_names[spec.key] = name

    def _count_interpreted(self) -> None:
        self._counters.interpreted_launches += 1

    # ---- pruning (Note [Pruning] in build.py) -----------------------------------------------

    def _stored_modules(self) -> set[str]:
        """The names of the modules of the stored specializations, which a new process may
        load (Note [Pruning] in build.py keeps them): recorded (Note [Stored module names]) or
        rendered."""
        names = set()
        for spec in self._cache.load_specs():
            if spec.key not in self._module_names:
                record = self._cache.load_module_record(spec.key, self._module_context())
                self._module_names[spec.key] = record["module"] if record is not None else \
                    build.module_name(self._render(spec).sources)
            names.add(self._module_names[spec.key])
        return names

    def _prune(self, spec: Specialization) -> None:
        """Note [Pruning] in build.py: after ``spec`` is stored, delete the modules of
        specializations the cache no longer stores, built before ``spec``'s."""
        try:
            built = Path(self._modules[spec.key].__file__).stat().st_mtime_ns
        except OSError:  # pruned by another process meanwhile: so it prunes
            return
        keep = self._stored_modules() | {m.__name__ for m in self._modules.values()}
        build.prune(self._cache.directory, keep, built)


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    """``method`` called through a weak reference to its object: a callback the runtime keeps
    for the rest of the process (``register_callback``) does not keep a JitFunction alive."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    return call
