"""fedprivacy: federated learning with differential privacy and secure aggregation.

The library never imports Flower (``flwr``): the privacy math, the crypto and the ML code are pure and
testable without it. The Flower glue lives in the top-level ``server`` and ``clients`` packages.
"""

__version__ = "0.1.0"
