"""Integrations with training frameworks; each is an optional import of its own
(``cpkit.integrations.transformers`` needs transformers)."""
