"""``python -m locafs ARGS``: runs the ``locafs`` binary of this package
with ARGS (for an environment whose bin/ is not on PATH)."""

import os
import sys

from ._binary import binary


def main():
    path = binary()
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
