"""``python -m ocdbt_py.cli``: the same as the ``ocdbt`` command."""

from __future__ import annotations

import sys

from ocdbt_py.cli import main

if __name__ == "__main__":
    sys.exit(main())
