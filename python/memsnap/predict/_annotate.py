"""memsnap.predict._annotate -- phases as external_annotations.

Module forward and backward ranges come from torch's ``ModTracker``
(``torch.distributed._tools.mod_tracker``, the module tracker of torch's
MemTracker): global forward pre/post hooks, and multi-grad hooks for the
backward of each module call.  A range is named by the module's qualified
name as in ``named_modules()`` of the outermost module that ran
(``blocks.0.attn``; the outermost module itself by its class name, e.g.
``GPT``), and the backward range gets `` (backward)`` appended.  A child of
a container (a name ending in an index: ``nn.Sequential``,
``nn.ModuleList``) is also named by its class, ``blocks.0 (Block)``, and a
name that would start with an index (the outermost module is a container)
starts with the outermost's name: ``Sequential.2 (Linear)``,
``Sequential.2 (Linear) (backward)``, ``Sequential.1.0 (ReLU)`` rather than
a bare ``2``.  Optimizer
steps come from torch's global optimizer step hooks, named
``<Optimizer class>.step`` (``AdamW.step``).

Each range is a START and an END entry of the snapshot's
``external_annotations`` (memory_viz draws them over the timeline).
"""

from __future__ import annotations

import warnings

BACKWARD_SUFFIX = " (backward)"


class Annotator:
    """Installs the hooks while active; ``emit(name, is_start)`` records."""

    def __init__(self, emit):
        self.emit = emit
        self._tracker = None
        self._handles: list = []
        self._open: dict = {}

    def _name(self, mod) -> str | None:
        if mod is None:
            return None
        fqn = self._tracker.get_known_fqn(mod)
        if fqn is None:
            return None
        root, _, rest = fqn.partition(".")
        if not rest:
            return root
        # Under a container at the top (nn.Sequential), the path starts
        # with an index: the outermost module's name goes first.
        name = fqn if rest.partition(".")[0].isdigit() else rest
        if rest.rpartition(".")[2].isdigit():
            # A container's child: its class tells what it is.
            return f"{name} ({type(mod).__name__})"
        return name

    def _pre_fw(self, mod, inputs):
        name = self._name(mod)
        if name is not None:
            self.emit(name, True)

    def _post_fw(self, mod, inputs, outputs):
        name = self._name(mod)
        if name is not None:
            self.emit(name, False)

    def _pre_bw(self, mod, grads):
        name = self._name(mod)
        if name is not None:
            key = id(mod)
            self._open[key] = self._open.get(key, 0) + 1
            self.emit(name + BACKWARD_SUFFIX, True)

    def _post_bw(self, mod, grads):
        name = self._name(mod)
        key = id(mod)
        if name is not None and self._open.get(key):
            self._open[key] -= 1
            self.emit(name + BACKWARD_SUFFIX, False)

    def _opt_pre(self, opt, args, kwargs):
        self.emit(f"{type(opt).__name__}.step", True)

    def _opt_post(self, opt, args, kwargs):
        self.emit(f"{type(opt).__name__}.step", False)

    def __enter__(self):
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._handles = [register_optimizer_step_pre_hook(self._opt_pre),
                         register_optimizer_step_post_hook(self._opt_post)]
        try:
            from torch.distributed._tools.mod_tracker import ModTracker
        except ImportError as e:  # torch built without torch.distributed
            warnings.warn(f"memsnap.predict: no module annotations ({e})", RuntimeWarning,
                          stacklevel=2)
            return self
        self._tracker = ModTracker()
        self._tracker.register_user_hooks(self._pre_fw, self._post_fw, self._pre_bw,
                                          self._post_bw)
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._tracker is not None:
            self._tracker.clear_user_hooks()
            self._tracker.__exit__(*exc)
            self._tracker = None
        return False
