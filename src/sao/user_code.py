"""Loading a user's class named in a config: ``"path/to/file.py:Name"`` or ``"package.module:Name"``.

Environments (``data.env``) and algorithms (``algo.advantage`` / ``algo.loss`` of ``type: custom``) are named
this way, so a user's code runs without a fork. A file is imported once per process (the same source gives
the same class object every time); a relative path is taken from the working directory.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["UserCodeError", "load_symbol"]

_LOADED: dict[str, Any] = {}  # resolved source -> the object


class UserCodeError(ValueError):
    """A source that cannot be loaded: malformed, a missing file or attribute, or an import that failed."""


def _key(source: str) -> str:
    path, _, attr = source.rpartition(":")
    return f"{Path(path).resolve()}:{attr}" if path.endswith(".py") else source


def load_symbol(source: str) -> Any:
    """Import ``"path/to/file.py:Name"`` or ``"package.module:Name"`` (once per process) and return
    ``Name``. Raises `UserCodeError` saying what is wrong."""
    path_or_module, sep, attr = source.rpartition(":")
    if not sep or not path_or_module or not attr:
        raise UserCodeError(f"{source!r} must look like 'path/to/file.py:ClassName' or 'module:ClassName'")
    key = _key(source)
    if key not in _LOADED:
        is_file = path_or_module.endswith(".py")
        module = _import_file(Path(path_or_module)) if is_file else _import(path_or_module)
        try:
            _LOADED[key] = getattr(module, attr)
        except AttributeError:
            raise UserCodeError(f"{path_or_module!r} has no attribute {attr!r}") from None
    return _LOADED[key]


def _import_file(file: Path) -> Any:
    if not file.is_file():
        raise UserCodeError(f"file {str(file)!r} does not exist")
    module_name = f"sao_user_{abs(hash(file.resolve()))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"cannot import {str(file)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise UserCodeError(f"importing {str(file)!r} failed: {type(err).__name__}: {err}") from err
    return module


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise UserCodeError(f"cannot import module {name!r}: {err}") from err
