"""Where the ``locafs`` binary is: the one this package was installed with.

The wheel puts the binary in the environment's scripts directory (``bin/``
of a virtual environment or conda environment, ``~/.local/bin`` for
``pip install --user``, ``TARGET/bin`` for ``pip install --target TARGET``),
the way ruff and uv ship theirs. This module looks there first, then on
``PATH`` (an admin's .deb or ``cargo install``), and never downloads or
builds anything.
"""

import os
import shutil
import sys
import sysconfig

from .control import LocafsError

__all__ = ["binary"]

_NAME = "locafs"


def _candidates():
    """The scripts directories a wheel install may have used, in order."""
    seen = []

    def add(path):
        if path and path not in seen:
            seen.append(path)

    add(sysconfig.get_path("scripts"))
    # pip install --user
    try:
        user_scheme = sysconfig.get_preferred_scheme("user")
    except AttributeError:  # Python < 3.10
        user_scheme = "posix_user"
    try:
        add(sysconfig.get_path("scripts", scheme=user_scheme))
    except KeyError:
        pass
    # pip install --target TARGET: TARGET/locafs/_binary.py, TARGET/bin/locafs
    here = os.path.dirname(os.path.abspath(__file__))
    add(os.path.join(os.path.dirname(here), "bin"))
    # The interpreter's own bin/ (a venv whose scheme is not the default).
    add(os.path.dirname(os.path.abspath(sys.executable)))
    return [os.path.join(d, _NAME) for d in seen]


def binary():
    """The path of the ``locafs`` binary: the one installed with this
    package, else the first on ``PATH``. Raises :class:`LocafsError` when
    there is none."""
    for path in _candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which(_NAME)
    if found:
        return found
    raise LocafsError(
        "the locafs binary was not found (looked in %s and on PATH): "
        "install the wheel (pip install locafs), or put locafs on PATH"
        % ", ".join(os.path.dirname(p) for p in _candidates())
    )
