from ampfix.frontends.cli import main

if __name__ == "__main__":  # pragma: no cover
    main(prog_name="ampfix")
