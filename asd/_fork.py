"""Locks that a forked child starts free.

A process that forks while another of its threads holds one of asd's locks (an evaluation in
flight, a cache entry being prepared) hands the child that lock held, by a thread that does not
exist there: every asd call in the child would wait forever. Each lock made here is reset in the
child (``os.register_at_fork``), as CPython resets its own module locks."""

from __future__ import annotations

import os


def fork_safe(lock):
    """``lock`` (a ``threading`` lock, RLock or Event), reset in a forked child; returns it."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lock._at_fork_reinit)
    return lock


def after_fork_in_child(fn) -> None:
    """Call ``fn()`` in every child forked from now on."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=fn)
