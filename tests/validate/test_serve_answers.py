import pytest

from patchctl.validate.answers import check_arithmetic, check_code, check_counting, check_fact

COUNT_OK = "\n".join(str(i) for i in range(1, 51))


@pytest.mark.parametrize("reply,ok", [("Paris", True), ("The capital is paris.", True), ("Lyon", False), ("Parisian", False)])
def test_fact(reply, ok):
    assert check_fact(reply).passed is ok


@pytest.mark.parametrize("reply,ok", [("391", True), ("17 * 23 = 391", True), ("392", False), ("3910", False), ("", False)])
def test_arithmetic(reply, ok):
    assert check_arithmetic(reply).passed is ok


def test_counting_accepts_clean_and_wrapped_lists():
    assert check_counting(COUNT_OK).passed
    assert check_counting("Sure!\n" + COUNT_OK + "\nDone.").passed
    assert check_counting(COUNT_OK.replace("\n", "\n\n")).passed


@pytest.mark.parametrize(
    "reply,why",
    [
        ("\n".join(str(i) for i in range(1, 30)), "stops after 29"),
        (COUNT_OK.replace("\n17\n", "\n18\n"), "line for 17"),
        ("1, 2, 3, 4", "no line reading '1'"),
    ],
)
def test_counting_rejects(reply, why):
    verdict = check_counting(reply)
    assert not verdict.passed and why in verdict.reason


def test_code_checked_by_parsing():
    assert check_code("```python\ndef add(a, b):\n    return a + b\n```").passed
    assert check_code("def add(x, y):\n    return y + x\n").passed
    assert not check_code("def add(a, b):\n    return a - b\n").passed
    assert "not valid Python" in check_code("def add(a, b) return a+b").reason
    assert "no function named add" in check_code("def plus(a, b):\n    return a + b").reason
    assert "parameters" in check_code("def add(a):\n    return a + a").reason


def test_judge_a_reply_that_stayed_in_reasoning_content():
    from patchctl.validate.answers import DEFAULT_CHECKS, judge

    fact = DEFAULT_CHECKS[0]
    verdict, right = judge(fact, "", "Hmm, France... its capital is Paris.", 32, "length")
    assert not verdict.passed and right is True
    assert verdict.reason == (
        "the answer is only in reasoning_content (36 chars, cut off at max_tokens 32): raise --reasoning-budget "
        "(it adds tokens to every answers prompt's max_tokens) or cap the server's reasoning budget; "
        "the reasoning reached the right answer, the reply did not"
    )
    # Stopped on its own with the reply in the reasoning channel: the parser is the first suspect.
    verdict, right = judge(fact, "  ", "Lyon, I think.", 32, "stop")
    assert (
        right is False
        and "finish_reason stop within max_tokens 32): check the server's reasoning parser" in (verdict.reason)
        and "reached the right answer" not in verdict.reason
    )
    assert judge(fact, "", "", 32, "stop") == ((False, "empty content"), None)
    assert judge(fact, "Paris", "Paris, surely.", 32, "stop") == ((True, "names Paris"), True)
