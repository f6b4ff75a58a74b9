"""Tiny models of new kinds of stack (BLOOM, DeepSeek-V3, EXAONE-4, Gemma-2; tests/support/trained.py), trained for 200 steps as byte-level
LMs on the shipped text so that their blocks are not interchangeable noise: both protocols under both per-layer
definitions equal the plain implementations (batch of one, float64 KL where the model runs in float64), and the
pruned export reloads with stock transformers and equals the plain removal."""
from __future__ import annotations

import pytest
import torch

from support.trained import GROUPS, check_trained, train_tiny

pytestmark = pytest.mark.slow("trains tiny models for 200 steps each")


@pytest.mark.parametrize("model_type", GROUPS["attention"])
def test_trained_kind_is_exact(model_type, tmp_path):
    torch.set_num_threads(1)
    model, record = train_tiny(model_type)
    check_trained(model, record, str(tmp_path))
