import sys

from .exceptions import note_signals_while_starting

if __name__ == "__main__":
    note_signals_while_starting()  # a signal while the modules load: exit 1, not death

from .batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
