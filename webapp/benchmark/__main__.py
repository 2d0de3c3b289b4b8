"""`python -m webapp.benchmark`: the benchmark without Django settings (see `webapp.benchmark.cli`)."""

import sys

from webapp.benchmark.cli import main

sys.exit(main())
