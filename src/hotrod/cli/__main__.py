"""`python -m hotrod.cli ...`: the `hotrod` command, for a process started without the console script."""

import sys

from hotrod.cli.main import main

sys.exit(main())
