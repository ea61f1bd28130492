"""`python -m bridge.aclctl`: the ACL tool's command line (it lives in `bridge.access`)."""

import sys

from bridge.access.aclctl import main

if __name__ == "__main__":
    sys.exit(main())
