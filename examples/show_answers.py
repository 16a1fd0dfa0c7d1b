"""Print each row of an lmpress output file as question and answer: `make demo`'s last step."""

import json
import sys
import textwrap


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            messages = row.get("messages") or []
            asked = next((m for m in reversed(messages[:-1]) if m.get("role") == "user"), {})
            content = asked.get("content", row.get("text", ""))
            if isinstance(content, list):
                content = "".join(p.get("text") or p.get("content") or "" for p in content)
            response = row["response"]
            answers = [s["text"] for s in response.get("samples", [])] or [response["text"]]
            print(f"> {content}")
            for answer in answers:
                print(textwrap.indent(textwrap.fill(answer.strip(), 96), "  "))
            print()


if __name__ == "__main__":
    main(sys.argv[1])
