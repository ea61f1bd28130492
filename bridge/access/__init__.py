"""Access control: authentication (password file, Redis users, client certificates), ACL rules
and their sources, the decision cache, and the `passwd` / `aclctl` tools."""

from bridge.access.control import AccessControl

__all__ = ["AccessControl"]
