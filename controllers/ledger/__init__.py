"""The ledger: who holds which device of which resource on which node.

One package under every reconciler and the CLI. It alone knows the per-node claim record
(``records``: its name and format) and merges every source that says a device is taken
(``book.Ledger``: fenced records, Bound statuses, decisions in flight, DRA allocations,
the kubelet's device-plugin allocations, malformed records, unavailable devices) into
the in-memory ID index placement reads (``tracker``) and a typed read model (``view``).
``writer`` is the one writer of the records (fenced, coalesced per node: ``coalesce``);
``release`` is the one place that decides to give a claim back.

Import the module you need (``from controllers.ledger.book import Ledger``): this
package's ``__init__`` imports nothing, so the tracker can be read below the rest.
"""
