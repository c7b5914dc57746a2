"""Entry script of the frozen app: the same as the ``iris-desktop`` console script."""

import sys

from iris_desktop.cli import main

if __name__ == "__main__":
    sys.exit(main())
