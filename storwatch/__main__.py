"""``python -m storwatch``."""

from __future__ import annotations

import sys

from storwatch.cli import main

sys.exit(main())
