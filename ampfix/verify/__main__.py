"""`python -m ampfix.verify SCRIPT ...`: the same command as `ampfix verify`."""

from ampfix.verify.command import main

if __name__ == "__main__":  # pragma: no cover
    main()
