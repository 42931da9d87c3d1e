"""`python -m zoo.cli`."""

from zoo.cli import main

main()
