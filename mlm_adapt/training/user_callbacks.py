"""Class-path callbacks of ``trainer.callbacks`` run inside the boundary of user code.

A hook of a user's callback that calls ``exit()`` or raises ``KeyboardInterrupt`` (or any other
``BaseException``) is a failure of that callback: Lightning would treat a ``KeyboardInterrupt`` as Ctrl-C
(a "graceful shutdown" and status 1) and let ``exit(0)`` end the command with status 0 and no message, as
if training had finished. Each hook the callback's class overrides is called through
:func:`mlm_adapt.errors.user_code` instead: one line naming the class, the hook and what it raised.
Callbacks of mlm_adapt and Lightning are left as they are.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import lightning as L

from mlm_adapt.errors import user_code

# Every hook Lightning calls on a callback (on_*, setup, teardown, state_dict, load_state_dict, ...).
HOOKS = tuple(
    name for name, value in vars(L.Callback).items() if not name.startswith("_") and inspect.isfunction(value)
)
_OWN_PACKAGES = ("mlm_adapt", "lightning", "lightning_fabric", "pytorch_lightning")
HINT = "a callback stops training with trainer.should_stop = True or raises an error, never exits"


class GuardedHook:
    """One overridden hook of a user's callback, called inside :func:`~mlm_adapt.errors.user_code`.

    Picklable (the callback and the hook's name), as the callback is.
    """

    def __init__(self, callback: L.Callback, name: str, who: str):
        self.callback = callback
        self.name = name
        self.who = who

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = type(self.callback)
        method = inspect.getattr_static(owner, self.name).__get__(self.callback, owner)
        with user_code(f"{self.who}.{self.name}", HINT):
            return method(*args, **kwargs)


def guard_user_callbacks(callbacks: Iterable[L.Callback]) -> None:
    """Routes every hook a user's callback overrides through :class:`GuardedHook` (in place)."""
    for callback in callbacks:
        cls = type(callback)
        if cls.__module__.split(".")[0] in _OWN_PACKAGES:
            continue
        who = f"trainer.callbacks: {cls.__module__}.{cls.__qualname__}"
        for name in HOOKS:
            overridden = inspect.getattr_static(cls, name, None) is not vars(L.Callback)[name]
            if overridden and not isinstance(vars(callback).get(name), GuardedHook):
                setattr(callback, name, GuardedHook(callback, name, who))
