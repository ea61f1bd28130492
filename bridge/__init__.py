"""MQTT-Bridge: a clustered MQTT gateway over RocketMQ storage."""

__version__ = "0.1.0"
