"""A local OpenAI-compatible + SGLang-native HTTP server that answers like a reasoning model:
responders on patchctl's one test server (checklib.testserver), which the smoke environment
imports (run_checks puts patchctl's own folder on its PYTHONPATH).

Chat completions put the text in `reasoning_content` with `content: null` (streaming and not);
/generate answers natively. Each completion is OUTPUT_WORDS words, one token each in the tiny
WordLevel tokenizer that `make_tokenizer` saves; the server reports its directory as model path.
`start(..., ping=True)` puts an SSE comment line before every event of a streamed reply, the
keep-alive sse-starlette servers (llama.cpp's Python server among them) send every 15 s.
"""

import json
import time

from checklib.testserver import Reply, Request, TestServer, json_reply, sse_reply

SERVED_NAME = "glm-5-reasoning-served"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
OUTPUT_WORDS = 8
TOKEN_DELAY_S = 0.004
# sse-starlette's keep-alive, byte for byte as it frames it (a comment field, CRLF line ends).
KEEPALIVE = b": ping - 2026-12-02 08:00:00.000000+00:00\r\n\r\n"


def make_tokenizer(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2}
    for w in WORDS + [f"w{i}" for i in range(200)]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]")
    fast.save_pretrained(str(directory))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(vocab)}))
    return directory


def _usage(n):
    return {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}


def _get(request, model_path):
    if request.path.startswith("/v1/models"):
        return json_reply(
            {"object": "list", "data": [{"id": SERVED_NAME, "object": "model", "root": model_path, "owned_by": "test"}]}
        )
    if request.path.startswith(("/model_info", "/get_model_info")):
        return json_reply({"model_path": model_path, "tokenizer_path": model_path, "is_generation": True})
    if request.path.startswith(("/get_server_info", "/server_info")):
        return json_reply({"internal_states": [{}]})
    return json_reply({})


def _pinged(reply: Reply) -> Reply:
    """The same stream with a keep-alive comment before each event."""
    events = [part for delay, data in reply.events for part in ((delay, KEEPALIVE), (0.0, data))]
    return Reply(reply.status, b"", reply.headers, events=events, framing=reply.framing)


def _post(request):
    req = request.json()
    words = WORDS[:OUTPUT_WORDS]
    if request.path.startswith("/v1/chat/completions"):
        if req.get("stream"):
            events = [
                (
                    TOKEN_DELAY_S,
                    {
                        "id": "c",
                        "object": "chat.completion.chunk",
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": None, "reasoning_content": w + " "},
                                "finish_reason": None,
                            }
                        ],
                    },
                )
                for w in words
            ]
            events.append(
                (
                    0.0,
                    {
                        "id": "c",
                        "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": {"content": None}, "finish_reason": "length"}],
                        "usage": _usage(len(words)),
                    },
                )
            )
            events.append((0.0, "[DONE]"))
            return sse_reply(events)
        time.sleep(TOKEN_DELAY_S * len(words))
        return json_reply(
            {
                "id": "c",
                "object": "chat.completion",
                "model": SERVED_NAME,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {"role": "assistant", "content": None, "reasoning_content": " ".join(words) + " "},
                    }
                ],
                "usage": _usage(len(words)),
            }
        )
    if request.path.startswith("/generate"):
        if req.get("stream"):
            events = [
                (
                    TOKEN_DELAY_S,
                    {
                        "text": " ".join(words[: i + 1]) + " ",
                        "meta_info": {"id": "g", "prompt_tokens": 4, "completion_tokens": i + 1},
                    },
                )
                for i in range(len(words))
            ]
            events.append((0.0, "[DONE]"))
            return sse_reply(events)
        time.sleep(TOKEN_DELAY_S * len(words))
        return json_reply(
            {
                "text": " ".join(words) + " ",
                "meta_info": {
                    "id": "g",
                    "prompt_tokens": 4,
                    "completion_tokens": len(words),
                    "finish_reason": {"type": "length", "length": len(words)},
                },
            }
        )
    return json_reply({})


def start(model_path, ping: bool = False) -> TestServer:
    """The server, started; `.root` is its URL, `.stop()` ends it."""
    model_path = str(model_path)

    def respond(request: Request) -> Reply:
        if request.method != "POST":
            return _get(request, model_path)
        reply = _post(request)
        return _pinged(reply) if ping and reply.events is not None else reply

    return TestServer([respond]).start()
