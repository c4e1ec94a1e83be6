"""Shared settings for the fedprivacy.ml tests: one torch thread (the machine is shared)."""

import torch

torch.set_num_threads(1)
