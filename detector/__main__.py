"""Run the command line with ``python -m detector``."""

from detector.cli.main import main

main()
