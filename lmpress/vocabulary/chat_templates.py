"""The chat templates a recipe can name (`model.chat_template: chatml`), kept apart from the
engines so that the tiny-model builders can write the same template into their models without
importing an engine."""

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NAMED_TEMPLATES = {"chatml": CHATML_TEMPLATE, "chat_ml": CHATML_TEMPLATE}
