"""Tools go to a chat template that renders them itself (a GGUF's Jinja template)."""

from iris_desktop.runtime.chat_format import JinjaFormat

TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]


def test_jinja_template_with_tools_receives_them():
    fmt = JinjaFormat(TEMPLATE)
    assert fmt.supports_tools
    messages = [{"role": "user", "content": "hi"}]
    assert fmt.render_prompt(messages, tools=TOOLS).startswith("<tools>read_file;</tools>")
    assert "<tools>" not in fmt.render_prompt(messages)


def test_template_without_tools_ignores_them():
    fmt = JinjaFormat(TEMPLATE.replace("{% if tools %}<tools>{% for t in tools %}"
                                       "{{ t.function.name }};{% endfor %}</tools>{% endif %}", ""))
    assert not fmt.supports_tools
    assert fmt.render_prompt([{"role": "user", "content": "hi"}], tools=TOOLS) == (
        "<|user|>hi<|end|><|assistant|>")
