"""Adapters of herd to other frameworks; each is an optional extra, imported only when used."""
