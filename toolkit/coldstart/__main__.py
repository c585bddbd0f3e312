"""`python -m coldstart ...`: the same as the `coldstart` command."""
import sys

from coldstart.main import main

sys.exit(main())
