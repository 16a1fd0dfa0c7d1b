"""`lmpress chat`, driven as a user drives it: the real program in a pseudo-terminal (pexpect),
against the ECHO plugin (whose reply is a transcript of exactly what the engine received) and
the tiny real NATIVE model."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pexpect
import pytest

from tests.conftest import REPO, run_lmpress, with_plugin

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The prompt for the next message: at the start of a line, ending with "> ".
PROMPT = re.compile(r"(?:^|\n)(?:\x1b\[\?2004h)?> ")
STATUS = re.compile(r"\[(\d+) tokens · [\d.]+ tokens/s · [\d.]+ s · prompt (\d+) tokens")


class ChatSession:
    """One `lmpress chat` in a pseudo-terminal, read the way a user reads it."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120):
        full_env = {**os.environ, "TERM": "xterm", **env}
        full_env.pop("NO_COLOR", None)
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "lmpress", "chat", *args],
            env=full_env,
            cwd=str(cwd),
            encoding="utf-8",
            codec_errors="replace",
            dimensions=(60, 1000),  # wide, so no line a test reads is wrapped
            timeout=timeout,
        )
        self.child.expect(PROMPT)
        self.welcome = clean(self.child.before)

    def say(self, line: str) -> str:
        """Type a line, press Enter, return what was shown until the next prompt (the typed
        line's echo left out)."""
        self.child.sendline(line)
        self.child.expect(PROMPT)
        shown = clean(self.child.before)
        typed_last = line.splitlines()[-1] if line else ""
        head, sep, rest = shown.partition(typed_last + "\n")
        return rest if sep else shown

    def leave(self, how: str = "/exit") -> int:
        if how == "eof":
            self.child.sendeof()
        else:
            self.child.sendline(how)
        self.child.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus

    def stop(self) -> None:
        """End the session however it stands: SIGKILL, then wait for the kernel to reap it
        (pexpect's own close(force=True) gives a killed child 0.1 s, which a loaded machine's
        exit of a Python process can outlast: "Could not terminate the child")."""
        if self.child.isalive():
            self.child.kill(signal.SIGKILL)
            self.child.wait()
        self.child.close()


def clean(text: str) -> str:
    return ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "")


def transcript(shown: str) -> list[dict[str, str]]:
    """What the ECHO engine received, read off its reply line."""
    for line in shown.splitlines():
        if line.startswith("ECHO ["):
            return json.loads(line[len("ECHO ") :])
    raise AssertionError(f"no ECHO reply in:\n{shown}")


def reply_line(shown: str) -> str:
    return next(line for line in shown.splitlines() if line.startswith("ECHO"))


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


@pytest.fixture
def echo_chat(echo_plugin, tmp_path):
    sessions = []

    def start(*args: str, env: dict[str, str] | None = None) -> ChatSession:
        session = ChatSession(
            ["--engine", "ECHO", *args],
            {**with_plugin(echo_plugin), "XDG_STATE_HOME": str(tmp_path / "state"), **(env or {})},
            tmp_path,
        )
        sessions.append(session)
        return session

    yield start
    for session in sessions:
        session.stop()


def test_second_turn_sees_the_first_and_a_status_line_follows_each_reply(echo_chat):
    chat = echo_chat()
    assert "Chatting with ECHO" in chat.welcome
    assert "/help" in chat.welcome and "Ctrl-D" in chat.welcome

    first = chat.say("my name is Ada")
    assert transcript(first) == [user("my name is Ada")]
    tokens, prompt = map(int, STATUS.search(first).groups())
    assert (tokens, prompt) == (len(reply_line(first).split()), 4)  # ECHO counts words

    second = chat.say("what is my name?")
    assert transcript(second) == [
        user("my name is Ada"),
        {"role": "assistant", "content": reply_line(first)},
        user("what is my name?"),
    ]
    assert STATUS.search(second)
    assert chat.leave("exit") == 0  # what a newcomer types, without the slash


def test_system_reset_retry_and_undo(echo_chat):
    chat = echo_chat("--system", "be brief")
    assert transcript(chat.say("hi"))[0] == {"role": "system", "content": "be brief"}

    assert "system prompt set" in chat.say("/system talk like a pirate")
    assert "talk like a pirate" in chat.say("/system")
    seen = transcript(chat.say("and now?"))
    assert seen[0] == {"role": "system", "content": "talk like a pirate"}
    assert [m["content"] for m in seen if m["role"] == "user"] == ["hi", "and now?"]

    assert "conversation forgotten" in chat.say("/reset")
    assert transcript(chat.say("fresh start")) == [
        {"role": "system", "content": "talk like a pirate"},
        user("fresh start"),
    ]

    # /retry sends the last message again, in place of the last exchange, not after it.
    retried = chat.say("/retry")
    assert "regenerating" in retried
    assert transcript(retried) == [
        {"role": "system", "content": "talk like a pirate"},
        user("fresh start"),
    ]

    chat.say("second")
    assert "dropped the last exchange; 1 left" in chat.say("/undo")
    seen = transcript(chat.say("third"))
    assert [m["content"] for m in seen if m["role"] == "user"] == ["fresh start", "third"]

    assert "system prompt removed" in chat.say("/system clear")
    chat.say("/reset")
    assert transcript(chat.say("bare")) == [user("bare")]
    assert chat.leave() == 0


def test_set_changes_what_the_engine_is_asked_and_refuses_bad_values(echo_chat):
    chat = echo_chat()
    assert "generation.max_new_tokens = 3" in chat.say("/set generation.max_new_tokens=3")
    shown = chat.say("count these words please")
    assert reply_line(shown) == 'ECHO [{"role": "user",'
    assert "cut at generation.max_new_tokens=3" in shown

    assert "generation.temperature = 0.2" in chat.say("/set generation.temperature=0.2")
    assert "temperature=0.2" in chat.say("/set")
    assert "generation.seed = 7" in chat.say("/set seed 7")  # shorthand: section and '=' optional
    assert chat.say("/set generation.temperature").strip() == "generation.temperature = 0.2"

    for typed, message in [
        (
            "/set generation.temperature=-1",
            "generation.temperature: -1.0 must be 0 (greedy) or more",
        ),
        ("/set generation.temperature=hot", "could not be converted to Float"),
        ("/set generation.temprature=1", "did you mean 'generation.temperature'?"),
        ("/set generation.top_p=0.5", "engine ECHO does not support generation.top_p"),
        ("/set model.model_name=x", "only generation settings change during a chat"),
        ("/set generation.batch_size=2", "fixed when the engine starts"),
        ("/set generation.top_logprobs=2", "needs generation.logprobs: true"),
    ]:
        shown = chat.say(typed)
        assert shown.strip().startswith("error: "), shown
        assert message in shown
        assert len(shown.strip().splitlines()) == 1, shown  # one line, no traceback

    assert "temperature=0.2" in chat.say("/set")  # refused values changed nothing
    assert chat.say("/set generation.max_new_tokens=256") and transcript(chat.say("still here"))
    assert chat.leave() == 0


def test_save_replays_with_batch_and_load_continues(echo_chat, echo_plugin, tmp_path):
    chat = echo_chat("--system", "be kind")
    first = chat.say("hello")
    second = chat.say("tell me more")
    shown = chat.say("/save chats.jsonl")
    assert "saved 2 exchange(s) to chats.jsonl (line 1)" in shown
    chat.leave()

    rows = [json.loads(line) for line in (tmp_path / "chats.jsonl").read_text().splitlines()]
    assert rows == [
        {
            "messages": [
                {"role": "system", "content": "be kind"},
                user("hello"),
                {"role": "assistant", "content": reply_line(first)},
                user("tell me more"),
                {"role": "assistant", "content": reply_line(second)},
            ]
        }
    ]

    run = run_lmpress(
        "batch", "--engine", "ECHO", "-i", "chats.jsonl", "-o", "out.jsonl",
        env=with_plugin(echo_plugin), cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    [out] = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    # The saved chat ends with the assistant: replayed, that last turn is regenerated.
    assert json.loads(out["response"]["text"][len("ECHO ") :]) == rows[0]["messages"][:-1]
    assert out["messages"][:-1] == rows[0]["messages"][:-1]
    assert out["messages"][-1]["content"] == out["response"]["text"]

    chat = echo_chat()
    shown = chat.say("/load chats.jsonl")
    assert "loaded 2 exchange(s) from chats.jsonl line 1 with its system prompt" in shown
    assert transcript(chat.say("and then?")) == [*rows[0]["messages"], user("and then?")]
    # A second save appends a row; /load FILE LINE picks one.
    assert "(line 2)" in chat.say("/save chats.jsonl")
    assert "line 1" in chat.say("/load chats.jsonl 1")
    assert transcript(chat.say("again")) == [*rows[0]["messages"], user("again")]
    assert "no such input file" in chat.say("/load nowhere.jsonl")
    chat.leave()


def test_load_of_an_unanswered_conversation_then_retry(echo_chat, tmp_path):
    row = {"messages": [user("question one"), {"role": "assistant", "content": "answer one"},
                        user("question two")]}  # fmt: skip
    (tmp_path / "open.jsonl").write_text(json.dumps(row) + "\n")
    chat = echo_chat()
    shown = chat.say("/load open.jsonl")
    assert "its last message has no reply yet: /retry generates one" in shown
    assert transcript(chat.say("/retry")) == row["messages"]
    chat.leave()


def test_unknown_command_lists_the_commands_and_help_explains_them(echo_chat):
    chat = echo_chat()
    shown = chat.say("/frobnicate")
    assert shown.strip() == (
        "error: unknown command '/frobnicate'. "
        "Commands: /help /reset /system /set /retry /undo /image /save /load /think /exit"
    )
    help_text = chat.say("/help")
    for usage in ["/reset", "/system [TEXT]", "/set [KEY=VALUE]", "/retry", "/undo", "/save FILE",
                  "/load FILE [LINE]", "/think [on|off]", "/exit", '"""', "Ctrl-C stops a reply"]:  # fmt: skip
        assert usage in help_text
    assert transcript(chat.say("//etc is a directory")) == [user("/etc is a directory")]
    assert chat.leave("/quit") == 0


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_stops_the_reply_keeps_it_and_stays(echo_chat, inherited):
    # A shell's background job starts with Ctrl-C ignored, and the chat inherits that.
    disposition = signal.SIG_IGN if inherited == "ignored" else signal.default_int_handler
    previous = signal.signal(signal.SIGINT, disposition)
    try:
        chat = echo_chat(env={"ECHO_DELAY_S": "0.1"})
    finally:
        signal.signal(signal.SIGINT, previous)
    words = " ".join(f"w{i}" for i in range(30))
    chat.child.sendline(words)
    chat.child.expect("ECHO")  # the reply has begun streaming
    chat.child.sendintr()
    chat.child.expect(PROMPT)
    shown = clean(chat.child.before)
    assert "stopped by Ctrl-C" in shown and "partial reply is kept" in shown

    # Ctrl-C at the prompt clears the line and does not leave either.
    chat.child.send("half a line")
    # As a person does: Ctrl-C after the keys are on screen. CPython's readline loop notices a
    # signal only when its select() is interrupted: a Ctrl-C that lands while it is still
    # handling the previous keys waits for the next key, and a person then presses Ctrl-C
    # again. So does the test; one KeyboardInterrupt comes of it either way.
    chat.child.expect("half a line")
    for _ in range(6):
        chat.child.sendintr()
        if chat.child.expect([PROMPT, pexpect.TIMEOUT], timeout=10) == 0:
            break
    else:
        pytest.fail("Ctrl-C at the prompt never gave a fresh prompt")
    assert "Ctrl-D or /exit leaves" in clean(chat.child.before)

    seen = transcript(chat.say("after"))
    full = "ECHO " + json.dumps([user(words)])
    kept = seen[1]["content"]
    assert seen[0] == user(words) and seen[1]["role"] == "assistant"
    assert kept.startswith("ECHO") and full.startswith(kept) and len(kept) < len(full)
    assert seen[2] == user("after")
    assert chat.leave("eof") == 0


@pytest.mark.parametrize("when", ["mid-reply", "at-the-prompt"])
def test_sigterm_ends_the_chat_cleanly_with_the_terminal_restored(echo_chat, when):
    chat = echo_chat(env={"ECHO_DELAY_S": "0.1"})
    if when == "mid-reply":
        chat.child.sendline(" ".join(f"w{i}" for i in range(30)))
        chat.child.expect("ECHO")  # streaming, keys not echoed meanwhile
    chat.child.kill(signal.SIGTERM)
    chat.child.expect(pexpect.EOF)
    echo_after = chat.child.getecho()  # the terminal's settings, as the chat left them
    chat.child.close()
    shown = clean(chat.child.before)
    assert chat.child.exitstatus == 143, shown
    assert "lmpress: stopped by SIGTERM" in shown
    assert "Traceback" not in shown
    assert echo_after  # typed keys echo again


def test_multi_line_input_history_and_completion(echo_chat, tmp_path):
    chat = echo_chat()
    chat.child.sendline('"""')
    chat.child.sendline("line one")
    assert transcript(chat.say('line two"""')) == [user("line one\nline two")]
    chat.say("/reset")
    chat.child.sendline("first half \\")
    assert transcript(chat.say("second half")) == [user("first half \nsecond half")]
    chat.say("/reset")

    # A block pasted into the terminal (bracketed paste) is one message.
    chat.child.send("\x1b[200~pasted a\npasted b\n\x1b[201~")
    chat.child.send("\r")
    chat.child.expect(STATUS)
    assert transcript(clean(chat.child.before)) == [user("pasted a\npasted b")]
    chat.child.expect(PROMPT)
    chat.say("/reset")

    # Up recalls the last typed line; Tab completes a command.
    chat.say("remember me")
    chat.child.send("\x1b[A")  # Up: "remember me"
    chat.child.send("\r")
    chat.child.expect(STATUS)
    seen = transcript(clean(chat.child.before))
    assert [m["content"] for m in seen if m["role"] == "user"] == ["remember me", "remember me"]
    chat.child.expect(PROMPT)
    chat.child.send("/rese\t\r")
    chat.child.expect("conversation forgotten")
    chat.child.expect(PROMPT)
    assert chat.leave() == 0
    # Typed lines are kept for the next session.
    history = (tmp_path / "state" / "lmpress" / "chat_history").read_text()
    assert "remember me" in history and "/exit" in history


@pytest.mark.parametrize("markdown", [False, True])
def test_a_reasoning_models_thinking_shows_dimmed_before_the_answer(echo_chat, markdown):
    chat = echo_chat(*(["--markdown"] if markdown else []), env={"ECHO_THINK": "hmm, well"})
    chat.child.sendline("hi")
    chat.child.expect(PROMPT)
    raw = chat.child.before.replace("\r\n", "\n")
    assert "\x1b[2mhmm, well\x1b[0m\n" in raw  # dimmed, on its own line
    assert raw.index("hmm, well") < raw.index("ECHO")  # before the answer
    hidden = chat.say("/think off")
    assert "thinking is hidden" in hidden
    again = chat.say("again")
    assert "hmm" not in again[: again.index("ECHO")]  # (the transcript shows the history's)
    chat.leave()


def test_markdown_is_rendered_only_when_asked(echo_chat):
    plain = echo_chat()
    assert transcript(plain.say("say **bold** now")) == [user("say **bold** now")]
    plain.leave()
    rendered = echo_chat("--markdown")
    shown = rendered.say("say **bold** now")
    assert 'ECHO [{"role": "user", "content": "say bold now"}]' in shown
    assert "**" not in shown
    rendered.leave()


def test_piped_mode_prints_one_reply_per_line(echo_plugin, tmp_path):
    script = "first\nsecond\n/set generation.max_new_tokens=2\nthird\n"
    run = run_lmpress("chat", "--engine", "ECHO", input=script, env=with_plugin(echo_plugin))
    assert run.returncode == 0, run.stderr
    replies = run.stdout.splitlines()
    assert len(replies) == 3
    assert json.loads(replies[1][len("ECHO ") :]) == [
        user("first"),
        {"role": "assistant", "content": replies[0]},
        user("second"),
    ]
    assert replies[2] == 'ECHO [{"role":'
    assert len(STATUS.findall(run.stderr)) == 3  # status lines go to stderr, not stdout
    assert "generation.max_new_tokens = 2" in run.stderr

    bad = run_lmpress(
        "chat", "--engine", "ECHO", input="/set generation.top_p=2\nstill fine\n",
        env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert bad.returncode == 1  # something failed, and the run went on
    assert "error: generation.top_p: 2.0 must be in (0, 1]" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert json.loads(bad.stdout[len("ECHO ") :]) == [user("still fine")]


def test_start_up_errors_are_one_line(echo_plugin):
    run = run_lmpress("chat", "--engine", "ECHO", "hello", env=with_plugin(echo_plugin))
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "lmpress: error: unexpected argument 'hello' "
        "(type messages at the chat prompt, or pipe them in)"
    )
    run = run_lmpress("chat", "--engine", "NOPE", input="")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1


# --- the tiny real model ----------------------------------------------------------------------


@pytest.mark.slow
def test_native_chat_keeps_history_saves_and_survives_errors(tiny_llama, tmp_path):
    chat = ChatSession(
        ["-c", "tiny-native", f"--model.model_name={tiny_llama}"],
        {"PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")},
        tmp_path,
    )
    assert f"Chatting with {tiny_llama} on NATIVE" in chat.welcome
    first = chat.say("hello")
    tokens1, prompt1 = map(int, STATUS.search(first).groups())
    assert tokens1 > 0
    second = chat.say("hello")
    _, prompt2 = map(int, STATUS.search(second).groups())
    assert prompt2 > prompt1 + 2  # the same message, with the first exchange before it
    chat.say("/reset")
    _, prompt3 = map(int, STATUS.search(chat.say("hello")).groups())
    assert prompt3 == prompt1

    assert "generation.temperature = 0.2" in chat.say("/set generation.temperature=0.2")
    chat.say("/set generation.seed=1")
    assert STATUS.search(chat.say("once more"))

    # A reply that fails (the prompt exceeds the model's context) is one line; chat goes on.
    failed = chat.say("word " * 700)
    shown = [line for line in failed.splitlines() if line.strip() and "word word" not in line]
    assert len(shown) == 1 and re.match(
        r"error: prompt is \d+ tokens, the model's context is 512 \(/retry", shown[0]
    )
    assert "saved 2 exchange(s) (not your unanswered message)" in chat.say("/save saved.jsonl")
    assert chat.leave() == 0

    [row] = [json.loads(line) for line in (tmp_path / "saved.jsonl").read_text().splitlines()]
    # What `batch` makes of a saved chat is the engine's business no more than the chat's:
    # test_save_replays_with_batch_and_load_continues replays one (on ECHO, which shows it).
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]


@pytest.mark.slow
def test_native_piped_then_ctrl_c_stops_generation_and_the_next_reply_comes(tiny_llama, tmp_path):
    # Piped: a reply per line, and a message over the model's context fails alone.
    script = "tell me a long story\n" + "word " * 700 + "\nhello again\n"
    run = run_lmpress(
        "chat", "-c", "tiny-native", f"--model.model_name={tiny_llama}",
        "--generation.max_new_tokens=8", "--generation.min_tokens=8", input=script,
    )  # fmt: skip
    assert run.returncode == 1  # the over-long message failed
    assert len(STATUS.findall(run.stderr)) == 2
    assert re.search(r"^error: prompt is \d+ tokens", run.stderr, re.M)
    assert "Traceback" not in run.stderr
    # Its first reply's first characters (greedy, so the chat's below are the same): the test
    # waits for the reply itself, not for any character a library might print first.
    first_word = re.search(r"[!-~]+", run.stdout).group()
    chat = ChatSession(
        # min_tokens keeps the random model from ending early, so there is time to interrupt.
        [
            "-c",
            "tiny-native",
            f"--model.model_name={tiny_llama}",
            "--generation.max_new_tokens=400",
            "--generation.min_tokens=400",
        ],  # fmt: skip
        {"PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")},
        tmp_path,
    )
    chat.child.sendline("tell me a long story")
    chat.child.expect("\x1b\\[\\?2004l\r")  # readline let go of the terminal
    chat.child.expect_exact(first_word)  # the reply has begun
    chat.child.sendintr()
    chat.child.expect(PROMPT)
    assert "stopped by Ctrl-C" in clean(chat.child.before)
    chat.say("/save stopped.jsonl")
    [row] = [json.loads(line) for line in (tmp_path / "stopped.jsonl").read_text().splitlines()]
    [asked, kept] = row["messages"]
    assert asked == user("tell me a long story")
    assert kept["role"] == "assistant" and kept["content"]  # the partial reply, kept
    chat.say("/set generation.max_new_tokens=8")
    chat.say("/set generation.min_tokens=0")
    shown = chat.say("short one")
    tokens, _ = map(int, STATUS.search(shown).groups())
    assert 0 < tokens <= 8
    assert chat.leave() == 0


def test_set_lists_every_generation_setting(echo_chat):
    shown = echo_chat().say("/set")
    for name in ("min_p", "repetition_penalty", "logprobs", "stop_token_ids", "n"):
        assert f"{name}=" in shown


def test_save_into_a_missing_directory_is_refused(echo_chat, tmp_path):
    chat = echo_chat()
    chat.say("hello")
    shown = chat.say("/save nowhere/chats.jsonl")
    assert "the directory nowhere does not exist" in shown
    assert not (tmp_path / "nowhere").exists()
