"""`python -m zoo.cli`."""

from zoo.cli import main

if __name__ == "__main__":  # not when a spawned worker process (zoo validate --jobs) imports the parent's main module
    main()
