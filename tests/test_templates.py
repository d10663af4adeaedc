"""Template resolution in step params."""

from __future__ import annotations

import pytest

from orch8_py.templates import TemplateError, render

SCOPE = {
    "data": {"amount": 1250, "user": {"email": "a@example.com"}, "items": [{"sku": "x"}]},
    "config": {"base_url": "https://pay.example"},
    "outputs": {"charge": {"json": {"id": "ch_1"}, "status": 200}},
    "instance_id": "0f0e",
    "runtime": {"attempt": 2},
}


def test_single_placeholder_keeps_its_type():
    assert render("{{ data.amount }}", SCOPE) == 1250
    assert render("{{data.user}}", SCOPE) == {"email": "a@example.com"}
    assert render(" {{ runtime.attempt }} ", SCOPE) == 2


def test_placeholders_inside_text():
    params = {"url": "{{ config.base_url }}/charges/{{ outputs.charge.json.id }}", "n": 3}
    assert render(params, SCOPE) == {"url": "https://pay.example/charges/ch_1", "n": 3}
    assert render("user {{ data.user }}", SCOPE) == 'user {"email":"a@example.com"}'
    assert render(["{{ data.items.0.sku }}", "{{ instance_id }}"], SCOPE) == ["x", "0f0e"]


def test_fallbacks():
    assert render("{{ data.missing | 'none' }}", SCOPE) == "none"
    assert render("x-{{ data.missing | '' }}-y", SCOPE) == "x--y"


@pytest.mark.parametrize(
    "text, message",
    [
        ("{{ nope.x }}", "unknown root 'nope'"),
        ("{{ data.missing }}", "data.missing not found"),
        ("{{ data.amount + 1 }}", "cannot parse"),
        ("a {{ data.amount", "unclosed"),
    ],
)
def test_errors_name_the_placeholder(text, message):
    with pytest.raises(TemplateError, match=message):
        render(text, SCOPE)
