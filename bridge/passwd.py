"""`python -m bridge.passwd`: the password tool's command line (it lives in `bridge.access`)."""

import sys

from bridge.access.passwd import main

if __name__ == "__main__":
    sys.exit(main())
