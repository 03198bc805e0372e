"""The ledger: who holds which device of which resource on which node.

One package under every reconciler and the CLI: ``records`` (the per-node claim record),
``book`` (every source that says a device is taken, merged), ``tracker`` (the in-memory
ID index placement reads), ``view`` (typed holders), ``writer`` (the one, fenced writer of
the records), ``release`` (the one place that gives a claim back). This ``__init__``
imports nothing, so the tracker can be read below the rest: import the module you need
(``from controllers.ledger.book import Ledger``).
"""
