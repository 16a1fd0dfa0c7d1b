"""`lmpress chat`: a multi-turn terminal chat over any engine.

One engine, one event loop, one conversation. Each message becomes one Request that carries the
whole history; the reply streams to stdout and, once complete (or stopped with Ctrl-C), joins
the history. Slash commands change the conversation or the generation settings between turns.

In a terminal, lines are read with readline (editing, history of typed lines, Tab completes
commands). Piped (`lmpress chat < script.txt`), each line of stdin is a message (or a command)
and only the replies go to stdout; status lines and notices always go to stderr.

- main.py          run_chat: the engine, the event loop and the terminal around one chat
- session.py       the loop: send a message, stream the reply, Ctrl-C, the status line
- commands.py      the slash commands, handed to the loop by main.py
- conversation.py  the history, and the JSONL row /save writes and /load reads
- terminal.py      reading lines (prompt, multi-line, readline), showing replies, styling
"""
