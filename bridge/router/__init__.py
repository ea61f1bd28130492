"""Subscription routing: topic filters -> subscribers, and shared-subscription groups."""

from bridge.router.shared import SharedGroup, SharedSubscriptions
from bridge.router.trie import DEFAULT_CACHE_SIZE, Entry, SubscriptionTrie

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "Entry",
    "SharedGroup",
    "SharedSubscriptions",
    "SubscriptionTrie",
]
