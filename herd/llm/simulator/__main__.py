"""``python -m herd.llm.simulator``: forwards to ``python -m herd.testing.simulator``."""

import sys

from herd.testing.simulator.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
