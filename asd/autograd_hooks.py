"""Autograd's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``, ``save_on_cpu``)
set aside while asd evaluates.

A pack hook sees the tensors each AD formulation saves, and those differ between asd's
strategies (a recorded graph saves none, a loop of backward passes saves its forward's, a
double backward its gradient's): a hook that changes values would change each strategy's
result differently, and ``torch.func``'s transforms refuse such hooks outright. asd's products are
the derivative of ``f`` as ``torch.func`` computes it, so the hooks are taken off the calling
thread's stack for the call and put back as they were after it.

``with unhooked():`` rather than a decorator: a decorator's frame would stand between the user's
call and the warnings asd issues (their ``stacklevel``).
"""

from __future__ import annotations

import torch

_A = torch._C._autograd


class _Suspended:
    """The calling thread's saved-tensor hooks off its stack inside the block, back on it after."""

    __slots__ = ("popped",)

    def __enter__(self):
        self.popped = []
        while (top := _A._top_saved_tensors_default_hooks(False)) is not None:
            _A._pop_saved_tensors_default_hooks()
            self.popped.append(top)
        return self

    def __exit__(self, *exc) -> bool:
        for pack, unpack in reversed(self.popped):
            _A._push_saved_tensors_default_hooks(pack, unpack)
        return False


class _Nothing:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


_NOTHING = _Nothing()


def unhooked():
    """A context in which the caller's saved-tensor hooks are set aside (:class:`_Suspended`), or
    one that does nothing where none are active. Hooks are left alone where they are disabled
    (``disable_saved_tensors_hooks``): the stack is empty there, or PyTorch would refuse to put them
    back."""
    if (_A._top_saved_tensors_default_hooks(False) is None
            or _A._saved_tensors_hooks_get_disabled_error_message() is not None):
        return _NOTHING
    return _Suspended()
