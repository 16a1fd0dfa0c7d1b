"""The grammar engine over SmolLM2's real vocabulary, read from llama.cpp and from transformers:
what each guided-decoding form admits, token by token."""

import json

import pytest

from lmpress.builtin_models.packaged import SMOLLM2_Q4_1
from lmpress.engines.common.tool_parsers import call_grammar
from lmpress.engines.local.guided import GrammarError, Grammars

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string"}},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "tags", "color"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def vocab():
    llama_cpp = pytest.importorskip("llama_cpp")
    from lmpress.engines.local.llamacpp.loading import load_llama

    llm = load_llama(str(SMOLLM2_Q4_1.path()), {"vocab_only": True, "verbose": False})
    return llm, Grammars.for_llama_vocab(llama_cpp.llama_model_get_vocab(llm.model), llm.n_vocab())


def admits(vocab, kind, value, text: str) -> bool:
    """Whether the grammar takes `text` whole and may end there."""
    llm, grammars = vocab
    matcher = grammars.matcher(kind, value)
    tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
    for token in tokens:
        if not matcher.allowed()[token]:
            return False
        matcher.accept(token)
    return matcher.accepting


@pytest.mark.parametrize(
    "kind, value, good, bad",
    [
        ("json", SCHEMA, '{"name": "Ann", "age": 30, "tags": ["a"], "color": "red"}',
         '{"name": "Ann", "age": 130, "tags": ["a"], "color": "red"}'),
        ("json", SCHEMA, '{"name": "Ann", "age": 0, "tags": [], "color": "blue"}',
         '{"name": "Ann", "age": 3, "tags": [], "color": "pink"}'),
        ("json_object", None, '{"anything": [1, 2]}', "[1, 2]"),
        ("regex", r"\d{3}-[a-z]+", "123-abc", "12-abc"),
        ("choice", ["positive", "negative"], "negative", "neutral"),
        ("grammar", 'root ::= "yes" | "no"', "yes", "maybe"),
        ("lark", call_grammar([{"function": {"name": "f", "parameters": SCHEMA}}], "hermes"),
         '<tool_call>\n{"name": "f", "arguments": {"name": "A", "age": 1, "tags": [], "color": "red"}}\n</tool_call>',
         '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'),
    ],
)  # fmt: skip
def test_each_form_admits_what_it_describes_and_nothing_else(vocab, kind, value, good, bad):
    assert admits(vocab, kind, value, good)
    assert not admits(vocab, kind, value, bad)


def test_a_complete_match_allows_only_the_end_of_sequence(vocab):
    llm, grammars = vocab
    matcher = grammars.matcher("choice", ["yes"])
    for token in llm.tokenize(b"yes", add_bos=False):
        matcher.accept(token)
    assert matcher.complete
    assert list(matcher.allowed().nonzero()[0]) == [llm.token_eos()]


def test_a_grammar_compiles_once_per_distinct_value(vocab):
    _, grammars = vocab
    before = grammars.compiled_count()
    for _ in range(5):
        grammars.matcher("json", {"type": "object", "properties": {"once": {"type": "integer"}}})
    assert grammars.compiled_count() == before + 1


def test_a_broken_grammar_says_why(vocab):
    _, grammars = vocab
    with pytest.raises(GrammarError):
        grammars.matcher("regex", "(unclosed")
    with pytest.raises(GrammarError):
        grammars.matcher("grammar", "root ::= (")


def test_the_transformers_tokenizer_gives_the_same_masks(vocab):
    """NATIVE reads the same GGUF through transformers: same vocabulary, same allowed tokens."""
    transformers = pytest.importorskip("transformers")
    path = str(SMOLLM2_Q4_1.path())
    import os

    tokenizer = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    hf = Grammars.for_hf_tokenizer(tokenizer)
    _, llama = vocab
    for kind, value in (("json", SCHEMA), ("choice", ["positive", "negative"])):
        a, b = hf.matcher(kind, value), llama.matcher(kind, value)
        assert (a.allowed() == b.allowed()).all()
        token = int(a.allowed().nonzero()[0][0])
        a.accept(token), b.accept(token)
        assert (a.allowed() == b.allowed()).all()
    assert json.dumps(SCHEMA)  # the schema itself is plain JSON


def test_a_sentencepiece_tokenizer_is_read_piece_by_piece():
    """llguidance cannot read a Metaspace decoder (Llama 2, Mistral); the pieces are read
    instead, '▁' as a space, and the text a grammar forces tokenizes to its exact bytes."""
    transformers = pytest.importorskip("transformers")
    from lmpress.builtin_models.tiny import resolve_model_name

    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_name("tiny:gpt2"))
    grammars = Grammars.for_hf_tokenizer(tokenizer, [tokenizer.eos_token_id])
    matcher = grammars.matcher("choice", ["yes", "no"])

    def pieces():
        return {tokenizer.convert_ids_to_tokens(int(i)) for i in matcher.allowed().nonzero()[0]}

    assert pieces() == {"y", "n"}
    matcher.accept(tokenizer.convert_tokens_to_ids("n"))
    assert pieces() == {"o"}  # not '▁o', which is " o"
