"""A run's plan (gpt2.training.plan): the chat template the model saved carries."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from training_helpers import CHAT_TEMPLATE

from gpt2.training.plan import ChatTemplateReplacedWarning, chat_template_for


def test_the_template_goes_to_the_data_then_to_the_model():
    data = SimpleNamespace(chat_template=CHAT_TEMPLATE, directory=Path("chat"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert chat_template_for(data, None, "'m'") == CHAT_TEMPLATE
        assert chat_template_for(data, CHAT_TEMPLATE, "'m'") == CHAT_TEMPLATE
        assert chat_template_for(SimpleNamespace(chat_template=None), "{{ mine }}", "'m'") == "{{ mine }}"
    with pytest.warns(
        ChatTemplateReplacedWarning,
        match="^the chat template of the model 'm' is replaced by the one the data in chat "
        "was rendered with: the model saved carries the data's$",
    ):
        assert chat_template_for(data, "{{ mine }}", "'m'") == CHAT_TEMPLATE
