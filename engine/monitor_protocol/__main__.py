"""`python -m monitor_protocol ...` is `mp ...`."""

import sys

from monitor_protocol.cli import main

if __name__ == "__main__":
    sys.exit(main())
