"""The cluster tests use the session's Redis and RocketMQ fixtures from tests/conftest.py."""
