import sys

from iris_desktop.cli import main

sys.exit(main())
