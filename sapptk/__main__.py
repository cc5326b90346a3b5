"""``python -m sapptk``: the same as the ``sapptk`` command."""

import sys

from sapptk.cli import main

sys.exit(main())
