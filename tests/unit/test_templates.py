"""Input templates (reference §3.1) and their guard against format-spec blow-ups."""

import pytest

from sie.core.errors import InvalidInput
from sie.core.templates import check_template, render_input


def test_render() -> None:
    assert render_input("t", None, False, {}) == "t"
    assert render_input("t", "Represent:", True, {}) == "Represent: t"
    assert render_input("t", "I", True, {"query_template": "query: {text}"}) == "query: t"
    assert render_input("t", "I", False, {"doc_template": "{instruction}|{text}"}) == "I|t"
    assert render_input("t", None, False, {"doc_template": "{{literal}} {text}"}) == "{literal} t"


@pytest.mark.parametrize(
    "template",
    [
        "{foo}",
        "{}",
        "{0}",
        "{text:.>3000000}",
        "{text:{instruction}}",
        "{text!r}",
        "{text.__class__}",
        "{text[0]}",
        "{text",
    ],
)
def test_rejected(template: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_template(template, field="params.options.doc_template")
    assert exc.value.fields["field"] == "params.options.doc_template"
    with pytest.raises(InvalidInput):
        render_input("x", "y", False, {"doc_template": template})
