"""fedprivacy's Flower wire format, shared by the ServerApp (``server/``) and the ClientApp (``clients/``).

The two apps never import each other; both import this package. :mod:`.codec` holds the train and
query messages, the metrics a client discloses and the results record of the ServerApp;
:mod:`.secagg_records` the secure-aggregation stages as records. It imports ``flwr`` and the library,
never ``server`` or ``clients``.
"""
