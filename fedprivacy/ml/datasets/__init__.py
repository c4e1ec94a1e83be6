"""Built-in data sets, one module each; every module registers its loader with
:func:`fedprivacy.ml.data.register_dataset`.

:mod:`fedprivacy.ml.data` imports every module of this package on the first registry lookup, so adding a
data set is adding one file here. Modules import only numpy at import time; heavy libraries
(scikit-learn, ``datasets``, ``flwr_datasets``) load inside the loaders.
"""
