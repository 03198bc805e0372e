"""``sdg`` (also ``kubectl sdg``), the operator CLI: read-only views of shared devices
and ``sdg doctor``. Above controllers in the layering; nothing imports it."""
