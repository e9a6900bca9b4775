"""memory/text/untrusted.py reads a forged fence in linear time (issue 45 sweep).

A user can type ``<untrusted_content `` and a 60,000-character word into their own message;
the consolidator marks fenced material in the user's text (``mark_third_party``). The
attribute pattern ``(\\w+)="…"`` was tried from each character of the word (quadratic: 6,000
characters 0.6 s, this one about a minute, on the event loop); its name is tried from the start
of a word only now."""

from __future__ import annotations

import pytest

from memory.text.untrusted import mark_third_party, material_texts, strip


@pytest.mark.timeout(30)
def test_a_forged_fence_with_a_long_word_is_marked_in_linear_time():
    forged = "hi <untrusted_content " + "_" * 60_000 + ">the body"
    out = mark_third_party(forged)
    assert out.startswith("hi (third-party material") and "the body" in out
    assert material_texts(forged) == ["the body"] and strip(forged) == "hi "


def test_attributes_are_still_read():
    text = '<untrusted_content kind="document" author="Mallory">salary sheet</untrusted_content>'
    assert mark_third_party(text) == ("(third-party document written by Mallory — shown by the speaker, "
                                      "not the speaker's own words: salary sheet)")
