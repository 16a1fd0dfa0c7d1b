"""The built-in judges (lmpress/pipeline/judges.py): what they ask a model, how they read its
answer, the one-line errors of bad settings and bad replies; and one judge on SmolLM2's real
weights, where a 135M model's answer must either parse or fail its row with one line."""

from __future__ import annotations

import jsonschema
import pytest

from lmpress.data.columns import TemplateError
from lmpress.pipeline.judges import JudgeReplyError, build_judge
from lmpress.pipeline.replies import quote
from lmpress.vocabulary.errors import ConfigError

QA = {
    "judge": "single",
    "rubric": "Is the answer correct?",
    "columns": {"question": "q", "answer": "a"},
}
ROW = {"q": "What is the capital of France?", "a": "Paris is the capital.", "other": 3}


def single(**settings):
    return build_judge({**QA, **settings})


def pairwise(**settings):
    columns = {"question": "q", "a": "first", "b": "second"}
    return build_judge({"judge": "pairwise", "columns": columns, **settings})


# --- single ---------------------------------------------------------------------------------


def test_a_single_judge_shows_the_rubric_and_the_rows_text_and_asks_for_json():
    judge = single()
    system, user = judge.messages(ROW)
    assert (system.role, user.role) == ("system", "user")
    assert "Is the answer correct?" in user.content
    assert "<question>\nWhat is the capital of France?\n</question>" in user.content
    assert "<answer>\nParis is the capital.\n</answer>" in user.content
    assert '{"explanation": "<one or two sentences>", "score": <an integer from 1 to 10>}' in (
        user.content
    )
    assert judge.needs() == {"q", "a"}
    assert judge.makes == ("score", "explanation")


def test_a_single_judges_scale_system_turn_and_prefix_are_its_settings():
    judge = single(scale=[1, 5], system="Grade harshly.", prefix="judge_")
    system, user = judge.messages(ROW)
    assert system.content == "Grade harshly."
    assert "an integer from 1 to 5, where 5 is best" in user.content
    assert judge.makes == ("judge_score", "judge_explanation")
    assert judge.parse('{"explanation": "ok", "score": 5}') == {
        "judge_score": 5,
        "judge_explanation": "ok",
    }


@pytest.mark.parametrize(
    ("reply", "score", "explanation"),
    [
        ('{"explanation": "Right answer.", "score": 9}', 9, "Right answer."),
        # A fenced block with prose around it, the score as a string.
        ('Here you go:\n```json\n{"explanation": "Fine.", "score": "7"}\n```\nHope it helps.',
         7, "Fine."),
        # The format ignored: a plain "Score: 7" line, the rest of the reply explaining.
        ("The answer names the right city.\nScore: 7", 7, "The answer names the right city."),
        ("**Score**: 8/10\nExplanation: Correct but terse.", 8, "Correct but terse."),
        ('{"score": 6.0, "Explanation": "Case of keys and 6.0 forgiven."}', 6,
         "Case of keys and 6.0 forgiven."),
        # A reasoning model's draft inside its thinking is not the answer.
        ('<think>{"explanation": "draft", "score": 2}</think>{"explanation": "x", "score": 8}',
         8, "x"),
    ],
)  # fmt: skip
def test_a_single_judge_reads_scores_wherever_models_write_them(reply, score, explanation):
    assert single().parse(reply) == {"score": score, "explanation": explanation}


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ('{"explanation": "Great.", "score": 11}',
         """score 11 is outside 1-10; reply '{"explanation": "Great.", "score": 11}'"""),
        ('{"explanation": "Hm.", "score": 7.5}', "score 7.5 is not an integer; reply "),
        ('{"explanation": "Hm.", "score": "high"}', "score 'high' is not an integer; reply "),
        ("I think this\nanswer is quite good overall, and I would like to elaborate at length",
         "no score in the judge's reply 'I think this answer is quite good overall, and I "
         "would like ...'"),
        ("", "no score in the judge's reply (an empty reply)"),
    ],
)  # fmt: skip
def test_a_reply_without_a_usable_score_fails_with_one_line_quoting_it(reply, error):
    with pytest.raises(JudgeReplyError) as caught:
        single().parse(reply)
    assert str(caught.value).startswith(error)
    assert "\n" not in str(caught.value)


def test_a_score_outside_a_custom_scale_is_refused():
    with pytest.raises(JudgeReplyError, match=r"^score 7 is outside 1-5; reply 'Score: 7'$"):
        single(scale=[1, 5]).parse("Score: 7")


def test_a_judge_is_single_unless_named_and_a_list_of_columns_shows_each_under_its_name():
    judge = build_judge({"rubric": "Is it polite?", "columns": ["reply"]})
    assert "<reply>\nThanks!\n</reply>" in judge.messages({"reply": "Thanks!"})[1].content
    assert judge.needs() == {"reply"}
    assert judge.makes == ("score", "explanation")


def test_values_that_are_not_text_are_shown_as_json_and_a_missing_column_is_the_rows_error():
    judge = build_judge({**QA, "columns": {"items": "list"}})
    assert '<items>\n["a", "é"]\n</items>' in judge.messages({"list": ["a", "é"]})[1].content
    with pytest.raises(TemplateError, match="^the judge reads column 'list', which this row"):
        judge.messages({"q": "?"})


def test_the_reply_schema_accepts_exactly_the_scores_the_judge_accepts():
    judge = single(scale=[1, 5])
    assert judge.reply_schema is not None
    jsonschema.validate({"explanation": "ok", "score": 5}, judge.reply_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"explanation": "ok", "score": 6}, judge.reply_schema)


# --- pairwise -------------------------------------------------------------------------------

PAIR = {"q": "2+2?", "first": "Four.", "second": "Five."}


def test_a_pairwise_judge_shows_both_answers_and_names_the_winner_by_column():
    judge = pairwise()
    _, user = judge.messages(PAIR)
    assert user.content.index("<response_a>\nFour.") < user.content.index("<response_b>\nFive.")
    assert "<question>\n2+2?\n</question>" in user.content
    assert '"winner": <"A", "B" or "tie">' in user.content
    assert judge.needs() == {"q", "first", "second"}
    assert judge.parse('{"explanation": "A is right.", "winner": "A"}') == {
        "winner": "a",
        "explanation": "A is right.",
    }


def test_the_order_ba_shows_b_first_and_still_names_the_winner_by_column():
    """What the position-bias check rests on: asked the other way round, a judge that
    prefers the same answer gives the same `winner`."""
    judge = pairwise(order="ba", prefix="ba_")
    _, user = judge.messages(PAIR)
    assert user.content.index("<response_a>\nFive.") < user.content.index("<response_b>\nFour.")
    assert judge.parse('{"explanation": "B is right.", "winner": "B"}') == {
        "ba_winner": "a",
        "ba_explanation": "B is right.",
    }


@pytest.mark.parametrize(
    ("reply", "winner"),
    [
        ("Winner: Response B", "b"),
        ("**Winner:** a", "a"),
        ('{"winner": "Response A", "explanation": "x"}', "a"),
        ("Both are wrong in the same way. [[C]]", "tie"),
        ("My verdict: [[B]]", "b"),
        ("<think>Maybe [[A]]?</think>On reflection, [[B]].", "b"),
        ('{"explanation": "Same.", "winner": "tie"}', "tie"),
    ],
)
def test_a_pairwise_judge_reads_verdicts_as_models_write_them(reply, winner):
    assert pairwise().parse(reply)["winner"] == winner


def test_a_tie_is_refused_where_ties_are_off_and_a_verdict_of_neither_letter_fails():
    judge = pairwise(ties=False)
    assert '"winner": <"A" or "B">' in judge.messages(PAIR)[1].content
    with pytest.raises(JudgeReplyError, match=r"^winner 'tie' is not A or B; reply '\{"):
        judge.parse('{"explanation": "Same.", "winner": "tie"}')
    with pytest.raises(JudgeReplyError, match=r"^no winner in the judge's reply 'I like both'$"):
        pairwise().parse("I like both")


# --- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"judge": None}, "judge: unknown judge None (one of single, pairwise, oumi)"),
        ({"judge": "singel"}, "judge: unknown judge 'singel' (did you mean 'single'?)"),
        ({"judge": "panel"}, "judge: unknown judge 'panel' (one of single, pairwise, oumi)"),
        ({"judge": "single", "columns": {"a": "a"}}, "'rubric' is required"),
        ({**QA, "scal": [1, 5]}, "unknown key 'scal' (did you mean 'scale'?)"),
        ({**QA, "scale": [5, 1]}, "scale: [5, 1] must rise (e.g. [1, 10])"),
        ({**QA, "scale": ["1", "5"]}, "scale.0: Input should be a valid integer (got '1')"),
        ({**QA, "columns": {}}, "columns: Value should have at least 1 item after validation, not 0 (got {})"),
        ({**QA, "columns": "answer"}, "columns: Input should be a valid dictionary (got 'answer')"),
        ({"judge": "pairwise", "columns": {"question": "q", "a": "x"}}, "'columns.b' is required"),
        ({"judge": "pairwise", "columns": {"question": "q", "a": "x", "b": "y"}, "order": "yx"},
         "order: Input should be 'ab' or 'ba' (got 'yx')"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_in_one_line_naming_the_key(settings, error):
    with pytest.raises(ConfigError) as caught:
        build_judge(settings, where="p.yaml: step 'grade': ")
    assert str(caught.value) == f"p.yaml: step 'grade': {error}"


# --- on SmolLM2's real weights --------------------------------------------------------------


def test_a_single_judge_on_smollm2_parses_its_reply_or_fails_the_row_in_one_line():
    """A 135M model is a poor judge: what matters is that its reply, whatever it is, becomes
    a score or one clear line, never a crash; and that under the judge's reply schema, as
    guided decoding, its reply is one the judge reads."""
    from lmpress import LLM
    from lmpress.vocabulary.guided import GuidedDecoding

    judge = single()
    row = {"q": "What is the capital of France?", "a": "The capital of France is Paris."}
    messages = [message.to_openai() for message in judge.messages(row)]
    with LLM("smollm2", temperature=0) as llm:
        free = llm.chat(messages, max_new_tokens=48)
        guided = llm.chat(
            messages, max_new_tokens=160, guided_decoding=GuidedDecoding(json=judge.reply_schema)
        )
    assert free.error is None and free.text.strip()
    try:
        parsed = judge.parse(free.text)
    except JudgeReplyError as exc:
        line = str(exc)
        assert "\n" not in line and line.startswith(("no score", "score "))
        assert line.endswith(f"reply {quote(free.text)}")
    else:
        assert 1 <= parsed["score"] <= 10 and isinstance(parsed["explanation"], str)
    assert guided.error is None
    parsed = judge.parse(guided.text)
    assert 1 <= parsed["score"] <= 10 and parsed["explanation"]
