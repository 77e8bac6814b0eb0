"""The torch.compile door's graph inputs named as the user's arguments.

Note [Names of graph inputs]: a Dynamo graph's inputs are the parameters of its
``forward``, named by Dynamo (``L_x_``, ``L_self_modules_lin_parameters_weight_``, ``s77`` for
a symbolic size), and Trident's reasons and signatures of the graph's specializations named
them so ("L_x_.size(0) == 8 expected, got 4", "forward(s77=3, ...)"). The door's miss
reasons (``stats``, the ``recompiles`` log's miss line), its warnings of eager calls, ``explain``
and ``specializations`` name each as ``trident.jit`` names the user's argument: its source
(``GraphArg.source``, recorded as the graph is compiled: Note [Backend graphs]) in Python (``L['self']._modules['lin']._parameters['weight']`` is
``self.lin.weight``, ``L['x'].size()[0]`` is ``x.size(0)``); a source of another form keeps
Dynamo's text. Only what is read changes: the specializations keep Dynamo's names (their
cache key and C).
"""

from __future__ import annotations

import re

_SOURCE_WORDS = [  # (pattern, replacement) in order, over Dynamo's source text (torch 2.11-2.13)
    (re.compile(r"^[LG]\['([A-Za-z_]\w*)'\]"), r"\1"),
    (re.compile(r"\._modules\['(\d+)'\]"), r"[\1]"),
    (re.compile(r"\._(?:modules|parameters|buffers)\['([A-Za-z_]\w*)'\]"), r".\1"),
    (re.compile(r"\.(size|stride)\(\)\[(\d+)\]"), r".\1(\2)"),
]


def user_name(source: str | None) -> str | None:
    """``source`` (a Dynamo source's text) as Python over the user's names, or None
    (Note [Names of graph inputs])."""
    if source is None:
        return None
    for pattern, words in _SOURCE_WORDS:
        source = pattern.sub(words, source)
    return source


def named(text: str, user_names: dict[str, str | None], symbolic=()) -> str:
    """``text`` with each graph parameter of ``user_names`` (``L_x_``, ``s77``) named as the
    user's (``x``, ``x.size(0)``; Note [Names of graph inputs]); a parameter of ``symbolic``
    (Dynamo's symbolic ints, symbolic in every specialization of the graph: Note [Int leaves]
    in policy.py) that a signature shows with its first call's value (``s77=8``) reads
    ``x.size(0)=?``: the graph serves any value. ``python -m trident list`` names stored
    signatures so, from what ``function.json`` recorded (Note [Listing without torch])."""
    for name in symbolic:
        text = re.sub(rf"(?<![\w.']){re.escape(name)}=-?\d+", f"{name}=?", text)
    names = {k: v for k, v in user_names.items() if v and v != k}
    if not names:
        return text
    words = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    return re.sub(rf"(?<![\w.'])({words})(?!\w)", lambda m: names[m[1]], text)


class NamedInputs:
    """What a graph's ``stats``, ``explain`` and ``specializations`` say, its inputs named as
    the user's (Note [Names of graph inputs])."""

    _user_names: dict[str, str] = {}  # graph parameter -> the user's name

    def _named(self, text: str) -> str:
        return named(text, self._user_names)

    def _eager(self, args, kwargs, why: str, warn: bool = True, miss: bool = True):
        return super()._eager(args, kwargs, self._named(why), warn, miss)  # (its warning too)

    def _miss_reason(self, call) -> str:  # (the recompiles log's miss line too)
        return self._named(super()._miss_reason(call))

    @property
    def stats(self):
        s = super().stats
        s.miss_reasons = [self._named(r) for r in s.miss_reasons]
        return s

    def explain(self, *args, **kwargs) -> str:
        return self._named(super().explain(*args, **kwargs))

    @property
    def specializations(self) -> list[str]:
        return [self._named(s) for s in super().specializations]
