import json

import pytest

from patchctl.validate.sse import ServerError, delta_from_object, iter_sse_data, parse_event


def test_events_split_anywhere_are_reassembled():
    stream = b'data: {"a": 1}\n\ndata: {"b"' + b": 2}\r\n\r\n: keep-alive comment\n\ndata: [DONE]\n\n"
    # Feed it one byte at a time: TCP may cut anywhere.
    chunks = [stream[i : i + 1] for i in range(len(stream))]
    assert list(iter_sse_data(chunks)) == ['{"a": 1}', '{"b": 2}', "[DONE]"]


def test_multiline_data_and_unterminated_tail():
    assert list(iter_sse_data([b"data: x\ndata: y\n\ndata:z"])) == ["x\ny", "z"]


def test_done_is_none_and_error_object_raises():
    assert parse_event("[DONE]") is None
    with pytest.raises(ServerError, match="overloaded"):
        parse_event(json.dumps({"error": {"message": "overloaded"}}))


def test_reasoning_with_content_null_counts_as_output():
    d = parse_event(json.dumps({"choices": [{"delta": {"content": None, "reasoning_content": "hmm"}}]}))
    assert (d.content, d.reasoning, d.has_output) == ("", "hmm", True)
    # Newer vLLM names the field `reasoning`.
    d2 = delta_from_object({"choices": [{"delta": {"content": None, "reasoning": "ok"}}]})
    assert d2.reasoning == "ok"


def test_role_only_and_usage_only_chunks_carry_no_output():
    role = parse_event(json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
    usage = parse_event(json.dumps({"choices": [], "usage": {"completion_tokens": 7}}))
    assert not role.has_output and not usage.has_output
    assert usage.completion_tokens == 7


def test_completions_text_and_non_streaming_message():
    assert delta_from_object({"choices": [{"text": "abc"}]}).content == "abc"
    message = {"content": None, "reasoning_content": "r"}
    msg = delta_from_object({"choices": [{"message": message, "finish_reason": "length"}]})
    assert (msg.content, msg.reasoning, msg.finish_reason) == ("", "r", "length")
