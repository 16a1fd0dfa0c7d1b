"""Oumi's judge configs as a judge step (lmpress/pipeline/oumi_judges.py): a config file in the
shape Oumi publishes runs as it is, judge_params inline too; each judgment type is read into its
type, and what cannot run is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lmpress.pipeline.judges import JudgeReplyError, build_judge
from lmpress.vocabulary.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures"
TRUTHFULNESS = FIXTURES / "oumi_truthfulness.yaml"
ROW = {"request": "When did Apollo 11 land?", "response": "In July 1969.", "extra": 1}


def inline(**params):
    return build_judge({"judge": "oumi", "judge_params": params})


def test_a_config_file_in_oumis_shape_runs_as_it_is():
    judge = build_judge({"judge": "oumi", "config": str(TRUTHFULNESS)})
    system, user = judge.messages(ROW)
    # The system instruction, then the answer's shape asked for after it.
    assert system.role == "system"
    assert system.content.startswith("You check answers for truth.")
    assert system.content.endswith(
        "Answer with this JSON object only, the explanation first:\n"
        '{"explanation": "<why>", "judgment": <"Yes" or "No">}'
    )
    assert user.content == (
        "Here is the data:\n[BEGIN DATA]\n***\n[user request]:\nWhen did Apollo 11 land?\n***\n"
        "[response]:\nIn July 1969.\n***\n[END DATA]\n"
    )
    assert judge.needs() == {"request", "response"}
    assert judge.makes == ("judgment", "explanation")
    assert judge.parse('{"explanation": "Correct date.", "judgment": "Yes"}') == {
        "judgment": True,
        "explanation": "Correct date.",
    }
    assert judge.parse('```json\n{"explanation": "Wrong.", "judgment": "No"}\n```') == {
        "judgment": False,
        "explanation": "Wrong.",
    }


def test_a_relative_config_path_is_found_beside_the_pipeline_and_columns_rename_placeholders(
    tmp_path,
):
    shutil.copy(TRUTHFULNESS, tmp_path / "truth.yaml")
    judge = build_judge(
        {
            "judge": "oumi",
            "config": "truth.yaml",
            "columns": {"response": "answer"},
            "prefix": "t_",
        },
        base_dir=tmp_path,
    )
    assert judge.needs() == {"request", "answer"}
    assert (
        "[response]:\nJuly 1969.\n"
        in judge.messages({"request": "?", "answer": "July 1969."})[1].content
    )
    assert judge.makes == ("t_judgment", "t_explanation")


def test_an_int_judgment_in_xml_without_explanation_asks_in_the_prompt_and_reads_the_tag():
    judge = inline(
        prompt_template="Rate the politeness of: {text}",
        response_format="XML",
        judgment_type="INT",
    )
    (user,) = judge.messages({"text": "Thanks a lot!"})
    assert user.content == (
        "Rate the politeness of: Thanks a lot!\n\nAnswer with these XML tags only:\n"
        "<judgment>an integer</judgment>"
    )
    assert judge.makes == ("judgment",)
    assert judge.parse("<judgment>4</judgment>") == {"judgment": 4}
    assert judge.parse("Sure. <judgment> 5 </judgment> Done.") == {"judgment": 5}
    assert judge.reply_schema is None  # guided JSON only where JSON is asked for
    with pytest.raises(JudgeReplyError, match=r"^judgment 'high' is not an integer; reply '"):
        judge.parse("<judgment>high</judgment>")
    with pytest.raises(JudgeReplyError, match=r"^no judgment in the judge's reply 'I cannot"):
        judge.parse("I cannot say.")


def test_a_bool_judgment_in_xml_is_oumis_default_and_reads_yes_and_no():
    judge = inline(prompt_template="Is this a greeting? {text}", include_explanation=True)
    (user,) = judge.messages({"text": "Hello!"})
    assert user.content.endswith(
        '<explanation>why</explanation>\n<judgment>"Yes" or "No"</judgment>'
    )
    reply = "<explanation>It greets.</explanation>\n<judgment>**Yes.**</judgment>"
    assert judge.parse(reply) == {"judgment": True, "explanation": "It greets."}
    assert judge.parse("<explanation>No.</explanation><judgment>no</judgment>")["judgment"] is False
    with pytest.raises(JudgeReplyError, match=r"""^judgment 'maybe' is not "Yes" or "No"; reply"""):
        judge.parse("<judgment>maybe</judgment>")


def test_an_enum_judgment_gives_its_options_score():
    judge = inline(
        prompt_template="Grade: {answer}",
        response_format="JSON",
        judgment_type="ENUM",
        judgment_scores={"excellent": 1.0, "good": 0.7, "poor": 0},
        include_explanation=True,
    )
    assert judge.makes == ("judgment", "explanation", "judgment_score")
    assert (
        '"judgment": <one of "excellent", "good", "poor">'
        in judge.messages({"answer": "x"})[0].content
    )
    assert judge.parse('{"explanation": "Solid.", "judgment": "Good"}') == {
        "judgment": "good",
        "explanation": "Solid.",
        "judgment_score": 0.7,
    }
    assert judge.reply_schema["properties"]["judgment"] == {
        "type": "string",
        "enum": ["excellent", "good", "poor"],
    }
    with pytest.raises(JudgeReplyError, match="^judgment 'superb' is not one of"):
        judge.parse('{"explanation": "", "judgment": "superb"}')


def test_a_raw_answer_takes_its_last_line_as_the_judgment():
    judge = inline(
        prompt_template="Score {text}", response_format="RAW", judgment_type="FLOAT",
        include_explanation=True,
    )  # fmt: skip
    assert judge.messages({"text": "t"})[0].content.endswith(
        "Explain your reasoning, then give your judgment (a number) on a last line."
    )
    assert judge.parse("It is short.\nIt is clear.\n0.85") == {
        "judgment": 0.85,
        "explanation": "It is short.\nIt is clear.",
    }
    assert judge.parse("Judgment: 3\nbecause") == {"judgment": 3.0, "explanation": "because"}


def test_template_variables_and_few_shot_examples():
    judge = inline(
        prompt_template="Does {response} follow {style}? Braces: {{}}",
        template_variables={"style": "{JSON}"},
        response_format="JSON",
        include_explanation=True,
        examples=[{"response": "{}", "judgment": True, "explanation": "Valid."}],
    )
    assert judge.needs() == {"response"}
    shot_user, shot_answer, user = judge.messages({"response": "[1]"})
    assert shot_user.content.startswith("Does {} follow {JSON}? Braces: {}\n\n")
    assert (shot_answer.role, shot_answer.content) == (
        "assistant",
        '{"explanation": "Valid.", "judgment": "Yes"}',
    )
    assert user.content.startswith("Does [1] follow {JSON}? Braces: {}\n\n")


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({}, "give 'config' (an Oumi judge config file) or 'judge_params' (inline), one of the two"),
        ({"judge_params": {"prompt_template": "{x}"}, "config": "a.yaml"},
         "give 'config' (an Oumi judge config file) or 'judge_params' (inline), one of the two"),
        ({"judge_params": {"prompt_template": "{x}", "judgement_type": "BOOL"}},
         "unknown key 'judge_params.judgement_type' (did you mean 'judge_params.judgment_type'?)"),
        ({"judge_params": {"prompt_template": "{x}", "judgment_type": "ENUM"}},
         "judgment_type ENUM needs judgment_scores: each option's score"),
        ({"judge_params": {"prompt_template": "{x}", "response_format": "YAML"}},
         "judge_params.response_format: Input should be 'json', 'xml' or 'raw' (got 'YAML')"),
        ({"judge_params": {"prompt_template": "{x} {}"}},
         "prompt_template: name a column in each {...}, e.g. {response}"),
        ({"judge_params": {"prompt_template": "{x", }},
         "prompt_template: expected '}' before end of string (write a literal brace as {{ or }})"),
        ({"judge_params": {"prompt_template": "{x}", "prompt_template_placeholders": ["y"]}},
         "prompt_template_placeholders: ['y'] differ from the template's placeholders ['x']"),
        ({"judge_params": {"prompt_template": "{x}"}, "columns": {"y": "z"}},
         "columns: 'y' is no placeholder of the prompt template (its placeholders: x)"),
        ({"judge_params": {"prompt_template": "{x}", "examples": [{"x": "1"}]}},
         "examples[0]: lacks judgment"),
    ],
)  # fmt: skip
def test_what_cannot_run_is_refused_in_one_line(settings, error):
    with pytest.raises(ConfigError) as caught:
        build_judge({"judge": "oumi", **settings}, where="p.yaml: step 'truth': ")
    assert str(caught.value) == f"p.yaml: step 'truth': {error}"


def test_a_config_file_that_cannot_run_is_refused_naming_it(tmp_path):
    rule = tmp_path / "rule.yaml"
    rule.write_text(
        'judge_params:\n  prompt_template: "{response}"\n'
        "rule_judge_params:\n  rule_type: regex\n  rule_config: {pattern: 'x'}\n"
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text("judge_params:\n  prompt_template: [unclosed\n")
    stray = tmp_path / "stray.yaml"
    stray.write_text("judge_params:\n  prompt_template: '{x}'\nevaluation: {}\n")
    cases = {
        rule: f"{rule}: a rule-based Oumi judge (rule_judge_params) needs no model; use a "
        f"filter step for it",
        broken: f"{broken}:3: expected ',' or ']', but got '<stream end>'",
        stray: f"{stray}: unknown key 'evaluation'",
        tmp_path / "missing.yaml": f"cannot read {tmp_path / 'missing.yaml'} (No such file or "
        f"directory)",
    }
    for path, error in cases.items():
        with pytest.raises(ConfigError) as caught:
            build_judge({"judge": "oumi", "config": path.name}, base_dir=tmp_path)
        assert str(caught.value) == f"config: {error}"
