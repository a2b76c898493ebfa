"""Kev request encoding in plain Python, written from KEV_SPEC.md §4 and §7 (not from upstream code).

Used by make_golden.py to turn /v1/systemone bodies into token rows, readout offsets and answers.
It needs no third-party package: the tokeniser is passed in as a function text -> list of ids, so the
rendering and layout rules can be checked here without HF (`python3 kev_encode.py` runs the self-test).
"""
import math
import re

# §4.3: any <|NAME|> in user text becomes <¦NAME¦> (U+00A6) so it cannot forge a delimiter.
_CONTROL_LOOKALIKE = re.compile(r"<\|([A-Za-z0-9_]+)\|>")

DELIMITER_NAMES = {
    "state": "<|fim_prefix|>",
    "question": "<|fim_middle|>",
    "open": "<|box_start|>",
    "close": "<|box_end|>",
    "decide": "<|fim_suffix|>",
    "pad": "<|endoftext|>",
}


def escape(text):
    return _CONTROL_LOOKALIKE.sub("<\u00a6\\1\u00a6>", text)


def _scalar(value):
    # §4.1 scalars. bool before int: bool is an int subclass in Python.
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"not a JSON scalar: {value!r}")


def _lines(value, indent):
    pad = " " * indent
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                out.append(f"{pad}{key}:")
                out.extend(_lines(item, indent + 2))
            else:
                out.append(f"{pad}{key}: {_scalar(item)}")
        return out
    if isinstance(value, list):
        out = []
        for item in value:
            sub = _lines(item, indent + 2)
            sub[0] = f"{pad}- {sub[0].lstrip()}"
            out.extend(sub)
        return out
    return [pad + _scalar(value)]


def render(value):
    """§4.1 JSON -> text. A string passes through verbatim; containers become YAML-like lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)) and not value:
        raise ValueError("empty containers are an open question (KEV_SPEC §12.3); fixtures avoid them")
    return "\n".join(_lines(value, 0))


def question_options(question):
    """§4.2: (option texts, option keys) in request order."""
    kind = question["type"]
    criteria = question.get("criteria")
    if kind == "noul":
        criteria = criteria or {}
        texts = []
        for word, key in (("no", "false"), ("yes", "true")):
            desc = render(criteria[key]) if key in criteria else ""
            texts.append(f"{word}: {desc}" if desc else word)
        return texts, ["false", "true"]
    if kind == "choice":
        texts, keys = [], []
        for name, desc_json in criteria.items():
            desc = render(desc_json)
            texts.append(f"{name}: {desc}" if desc else name)
            keys.append(name)
        return texts, keys
    if kind == "score":
        texts = [render(level) for level in criteria]
        return texts, [str(i) for i in range(len(texts))]
    raise ValueError(f"unknown question type {kind!r}")


def encode_request(body, tokenize, ids):
    """Lays out a /v1/systemone body per §4.4.

    tokenize: text -> list[int] (HF encode, no special-token insertion). ids: delimiter role -> id.
    Returns the state text and ids S (with the delimiter) and, per question, the row B_k with its
    close offsets and decide offset (row-relative; absolute index = Ls + offset).
    """
    state_text = escape(render(body["state"]))
    state_ids = [ids["state"]] + tokenize(state_text)
    questions = []
    for qid, question in body["questions"].items():
        instr_json = question.get("instructions")
        instr_text = escape(render(instr_json)) if instr_json is not None else ""
        option_texts, keys = question_options(question)
        option_texts = [escape(t) for t in option_texts]
        row = [ids["question"]] + tokenize(instr_text)
        close = []
        for text in option_texts:
            row += [ids["open"]] + tokenize(text) + [ids["close"]]
            close.append(len(row) - 1)
        row.append(ids["decide"])
        questions.append({
            "id": qid,
            "type": question["type"],
            "instruction_text": instr_text,
            "option_texts": option_texts,
            "keys": keys,
            "row_ids": row,
            "close": close,
            "decide": len(row) - 1,
        })
    return {"state_text": state_text, "state_ids": state_ids, "questions": questions}


def softmax64(logits):
    m = max(logits)
    e = [math.exp(z - m) for z in logits]
    s = sum(e)
    return [x / s for x in e]


def answer(question, probs):
    """§7 answers, newest variants (no rounding, no renormalisation)."""
    kind = question["type"]
    keys = question["keys"]
    k = len(probs)
    best = max(range(k), key=lambda i: (probs[i], -i))  # first maximum
    if kind == "noul":
        return {"type": "noul", "noul": probs[1]}
    if kind == "choice":
        conf = 1.0 if k == 1 else (probs[best] - 1.0 / k) / (1.0 - 1.0 / k)
        return {"type": "choice", "choice": keys[best], "confidence": conf,
                "probabilities": dict(zip(keys, probs))}
    score = sum(i * p for i, p in enumerate(probs))
    if k == 1:
        conf = 1.0
    else:
        d_l = (k * k // 4) / k
        conf = max(0.0, 1.0 - sum(p * abs(i - best) for i, p in enumerate(probs)) / d_l)
    conf_old = 1.0 if k == 1 else 1.0 - sum(p * abs(i - best) for i, p in enumerate(probs)) / (k - 1)
    return {"type": "score", "score": score, "confidence": conf, "confidence_old": conf_old,
            "legend": dict(zip(keys, question["option_texts"])),
            "probabilities": dict(zip(keys, probs))}


def _self_test():
    state = {"ticket": "Charged twice for order 88", "amount": 42.5, "tags": ["billing", "urgent"]}
    want = "ticket: Charged twice for order 88\namount: 42.5\ntags:\n  - billing\n  - urgent"
    assert render(state) == want, render(state)
    assert render([{"a": 1, "b": [True, None]}, 2.0, 1e-05, 1e16]) == \
        "- a: 1\n  b:\n    - True\n    - \n- 2.0\n- 1e-05\n- 1e+16"
    assert escape("x<|fim_prefix|>y<|a b|><tool_call>") == "x<\u00a6fim_prefix\u00a6>y<|a b|><tool_call>"
    dup = {"type": "noul", "instructions": "The customer was charged twice.",
           "criteria": {"true": "Two identical charges exist."}}
    assert question_options(dup)[0] == ["no", "yes: Two identical charges exist."]
    team = {"type": "choice", "criteria": {"billing": "Payments and refunds", "tech": None}}
    assert question_options(team)[0] == ["billing: Payments and refunds", "tech"]
    # Layout arithmetic of §11 with a fake tokeniser (one id per character).
    ids = {"state": 1000, "question": 1001, "open": 1002, "close": 1003, "decide": 1004, "pad": 1005}
    enc = encode_request({"state": "abc", "questions": {"q": {"type": "choice", "instructions": "xy",
                                                          "criteria": {"u": None, "vw": None}}}},
                         lambda t: [ord(c) for c in t], ids)
    q = enc["questions"][0]
    assert enc["state_ids"] == [1000, 97, 98, 99]
    assert q["row_ids"] == [1001, 120, 121, 1002, 117, 1003, 1002, 118, 119, 1003, 1004]
    assert q["close"] == [5, 9] and q["decide"] == 10
    assert abs(answer({"type": "score", "keys": ["0", "1", "2"], "option_texts": ["a", "b", "c"]},
                      [0.2, 0.5, 0.3])["confidence"] - (1 - 0.5 / (2 / 3))) < 1e-12
    print("kev_encode self-test passed")


if __name__ == "__main__":
    _self_test()
