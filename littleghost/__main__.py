"""``python -m littleghost``: the ``littleghost`` command line."""

from littleghost.cli import main

if __name__ == "__main__":
    main()
