"""``python -m oracle.bench``: the benchmark's command line (its options: ``--help``)."""

import sys

from . import main

sys.exit(main())
