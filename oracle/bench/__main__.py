"""``python -m oracle.bench``: the benchmark's command line (its options: ``--help``)."""

import sys

from oracle.bench import main

sys.exit(main())
