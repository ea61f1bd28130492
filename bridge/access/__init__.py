"""Access control: authentication (password file, Redis users, client certificates, SCRAM-SHA-256
for MQTT 5.0 enhanced authentication), ACL rules and their sources, the decision cache, and the
`passwd` / `aclctl` tools."""

from bridge.access.control import AccessControl, UserStoreUnavailable
from bridge.access.scram import MECHANISM as SCRAM_SHA_256
from bridge.access.scram import ScramCredential, ScramError, ScramServer

__all__ = [
    "SCRAM_SHA_256",
    "AccessControl",
    "ScramCredential",
    "ScramError",
    "ScramServer",
    "UserStoreUnavailable",
]
