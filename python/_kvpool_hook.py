"""KVPOOL_AS_MOONCAKE=1 in any Python process (kvpool_as_mooncake.pth).

The package installs ``kvpool_as_mooncake.pth`` beside itself in
site-packages; Python's ``site`` runs its one line, ``import _kvpool_hook``,
at every interpreter start. Without the variable this module does nothing
else (it imports nothing of kvpool). With ``KVPOOL_AS_MOONCAKE=1`` (also
true/yes) it puts a finder first on ``sys.meta_path`` that answers the
process's first ``import mooncake`` (``import mooncake.store``, ``from
mooncake.store import ...``) by calling ``kvpool.install_as_mooncake()``:
from then on ``mooncake``, ``mooncake.store`` and
``mooncake.mooncake_config`` are kvpool's. Nothing is imported before a
program asks for mooncake, so an interpreter that never does pays nothing.
If kvpool cannot be imported then, the import fails (ImportError naming
the variable) instead of falling back to a real Mooncake: the process
asked for kvpool."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any, Optional, Sequence

_ON = ("1", "true", "True", "yes")


class _Loader(importlib.abc.Loader):
    """Hands the import system the module install_as_mooncake() made."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        return sys.modules[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Answers the first import of the top-level ``mooncake`` package, once:
    installing kvpool's stand-in registers every submodule it has, so later
    imports find them in sys.modules and never reach a finder."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != "mooncake":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import kvpool
            kvpool.install_as_mooncake()
        except Exception as e:  # the process asked for kvpool: say why it is not there
            raise ImportError(f"KVPOOL_AS_MOONCAKE is set but kvpool could not stand in for "
                              f"mooncake: {e}", name=fullname) from e
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


def _activate() -> None:
    if os.environ.get("KVPOOL_AS_MOONCAKE", "") not in _ON:
        return
    if "mooncake" in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


_activate()
