"""Codegen of a specialization's value checks (Note [Value checks]).

Note [Value checks]
~~~~~~~~~~~~~~~~~~~
A specialization whose trace took Python numbers from the call's tensors (Note [Value reads] in
lower/values.py: ``bool(mask.sum() == mask.numel())``) holds them as ``ValueChecks``: a plan of
their own, of pure ATen ops and size steps over the arguments, whose outputs are the numbers,
and the values the trace saw. The module's ``check_values()`` runs that plan with a frame of
its own (``trt_check_frame``), compares each number with its value, and releases what it made:
1 all equal, 0 one differs, -1 an error (set), -2 a step failed that eager may recover from (the
call runs eagerly: nothing visible was done). ``scm_call`` runs it after ``guard()`` and before
the launch sequence or the CUDA graph's replay (never inside a capture: the read syncs with the
device, as eager's ``bool`` does), and a differing value is a miss (``TRT_MISS``): the
dispatcher tries the next specialization, and where none holds the miss path traces the call
again, down the other branch, into a second specialization. ``scm_match`` (the miss path's
``_installed_match``) runs it too, so Python and C pick the same specialization; its Python
twin, for specializations not installed (``_stored_fit``) and explanations, is
``frontend/values.py``'s. A host scalar (Note [Host scalars] in ir/specialization.py: a static
cache's ``cumulative_length``, which transformers' ``q_offset == 0`` reads) is read where it
lies, on the host, before the replay copies it in.
"""

from __future__ import annotations

from trident.codegen.cprint import c_comment, c_int
from trident.ir.operands import Scalar


def all_steps(spec) -> list:
    """The steps of ``spec``'s launch sequence and of its value checks."""
    return spec.plan.steps + (spec.checks.plan.steps if spec.checks else [])


def render_checks(spec, renderer_class, *module) -> dict | None:
    """The template's context of ``spec``'s ``check_values()``, or None: a ``renderer_class``
    (render.py's ``_SpecRenderer``) of the ``module``'s tables (its operators, callbacks and
    kernels) renders the checks' plan."""
    if spec.checks is None:
        return None
    plan = spec.checks.plan
    renderer = renderer_class(spec, *module)
    renderer.static_prefix = "q"
    renderer.on_error = "eager"
    steps = [renderer.step(i, s) for i, s in enumerate(plan.steps)]
    for step in steps:
        step.on_error = "eager"
    compares = []
    for k, (o, value) in enumerate(zip(plan.outputs, spec.checks.values)):
        assert isinstance(o, Scalar)
        where, text = spec.checks.lines[k] if k < len(spec.checks.lines) else ("?", "")
        compares.append((f"(s[{o.i}].tag == TRT_INT || s[{o.i}].tag == TRT_BOOL) && "
                         f"s[{o.i}].u.i == {c_int(int(value))}",
                         c_comment(f"{where}: {text} read {value!r}")))
    return {"steps": steps, "statics": renderer.statics, "num_values": plan.num_values,
            "num_lists": plan.num_lists, "num_scalars": plan.num_scalars,
            "num_views": renderer.num_slots, "frame": [],
            "max_rets": max([len(s.results) for s in plan.steps] + [1]), "compares": compares}
