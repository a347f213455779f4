"""``python -m opcost.cli``: the ``opcost`` command."""

import sys

from opcost.cli import main

if __name__ == "__main__":
    sys.exit(main())
