"""`python -m sim.cli` runs the servesim command line."""
import sys

from sim.cli.main import main

sys.exit(main())
