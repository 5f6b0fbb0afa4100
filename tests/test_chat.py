"""trtspec.chat: the embedded byte model's chat template, rendered to the text it was trained on and
stopped where its next turn starts, and a trtspec_chat_stop that could not stop anything refused."""

from __future__ import annotations

import pytest

from trtspec.chat import load_chat_template
from trtspec.errors import CheckpointError
from trtspec.train.corpus import CHAT_STOP


def test_the_byte_models_template_renders_a_conversation_up_to_the_answer(tiny_target_dir,
                                                                          tiny_target_config):
    template = load_chat_template(tiny_target_dir, tiny_target_config, None)  # no tokenizer used
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "1 + 2"},
                {"role": "assistant", "content": "3"}, {"role": "user", "content": "2 + 2"}]
    # the corpus's format: the system line, "Q: ..\n", "A: ..\n", and the generation prompt "A: "
    assert template.render(messages) == "S\nQ: 1 + 2\nA: 3\nQ: 2 + 2\nA: "
    assert template.stop == CHAT_STOP


@pytest.mark.parametrize("stop", [[""], ["\nQ:", 5], "\nQ:"])
def test_a_chat_stop_that_is_no_list_of_texts_is_refused(stop, tiny_target_dir, tiny_target_config):
    tiny_target_config.trtspec_chat_stop = stop  # "" would end every answer at once; 5 is no text
    with pytest.raises(CheckpointError, match="trtspec_chat_stop must be a list of texts"):
        load_chat_template(tiny_target_dir, tiny_target_config, None)
