"""Autograd's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``, ``save_on_cpu``)
set aside while asd evaluates.

A pack hook sees the tensors each AD formulation saves, and those differ between asd's
strategies (a recorded graph saves none, a loop of backward passes saves its forward's, a
double backward its gradient's): a hook that changes values would change each strategy's
result differently, and ``torch.func``'s transforms refuse such hooks outright. asd's products are
the derivative of ``f`` as ``torch.func`` computes it, so the hooks are taken off the calling
thread's stack for the call and put back as they were after it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import torch

_A = torch._C._autograd


def _active() -> bool:
    return _A._top_saved_tensors_default_hooks(False) is not None


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """The calling thread's saved-tensor hooks off its stack inside the block, back on it after.
    Left alone where the hooks are disabled (``disable_saved_tensors_hooks``): the stack is empty
    there, or PyTorch would refuse to put the hooks back."""
    popped = []
    if _A._saved_tensors_hooks_get_disabled_error_message() is None:
        while (top := _A._top_saved_tensors_default_hooks(False)) is not None:
            _A._pop_saved_tensors_default_hooks()
            popped.append(top)
    try:
        yield
    finally:
        for pack, unpack in reversed(popped):
            _A._push_saved_tensors_default_hooks(pack, unpack)


def unhooked(method: Callable) -> Callable:
    """``method`` run with the caller's saved-tensor hooks set aside (:func:`suspended`)."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        if not _active():
            return method(*args, **kwargs)
        with suspended():
            return method(*args, **kwargs)

    return run
