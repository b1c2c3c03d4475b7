"""A local OpenAI-compatible + SGLang-native HTTP server that answers like a reasoning model.

Chat completions put the text in `reasoning_content` with `content: null` (streaming and not);
/generate answers natively. Each completion is OUTPUT_WORDS words, one token each in the tiny
WordLevel tokenizer that `make_tokenizer` saves; the server reports its directory as model path.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED_NAME = "glm-5-reasoning-served"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
OUTPUT_WORDS = 8
TOKEN_DELAY_S = 0.004


def make_tokenizer(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2}
    for w in WORDS + [f"w{i}" for i in range(200)]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]"
    )
    fast.save_pretrained(str(directory))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(vocab)}))
    return directory


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model_path = ""

    def log_message(self, *a):
        pass

    def _json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _sse(self, events):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for ev in events:
            if isinstance(ev, float):
                time.sleep(ev)
                continue
            data = b"data: " + (ev if isinstance(ev, bytes) else json.dumps(ev).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self):
        if self.path.startswith("/v1/models"):
            return self._json({"object": "list", "data": [
                {"id": SERVED_NAME, "object": "model", "root": self.model_path, "owned_by": "test"}]})
        if self.path.startswith(("/model_info", "/get_model_info")):
            return self._json({"model_path": self.model_path, "tokenizer_path": self.model_path,
                               "is_generation": True})
        if self.path.startswith(("/get_server_info", "/server_info")):
            return self._json({"internal_states": [{}]})
        return self._json({})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(length) or b"{}")
        words = WORDS[:OUTPUT_WORDS]
        if self.path.startswith("/v1/chat/completions"):
            if req.get("stream"):
                events = []
                for w in words:
                    events += [TOKEN_DELAY_S, {"id": "c", "object": "chat.completion.chunk", "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": None,
                                               "reasoning_content": w + " "}, "finish_reason": None}]}]
                events += [{"id": "c", "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"content": None}, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": len(words), "total_tokens": 4 + len(words)}}]
                events.append(b"[DONE]")
                return self._sse(events)
            time.sleep(TOKEN_DELAY_S * len(words))
            return self._json({"id": "c", "object": "chat.completion", "model": SERVED_NAME, "choices": [
                {"index": 0, "finish_reason": "length", "message": {
                    "role": "assistant", "content": None, "reasoning_content": " ".join(words) + " "}}],
                "usage": {"prompt_tokens": 4, "completion_tokens": len(words), "total_tokens": 4 + len(words)}})
        if self.path.startswith("/generate"):
            if req.get("stream"):
                events = []
                for i in range(len(words)):
                    events += [TOKEN_DELAY_S, {"text": " ".join(words[: i + 1]) + " ", "meta_info": {
                        "id": "g", "prompt_tokens": 4, "completion_tokens": i + 1}}]
                events.append(b"[DONE]")
                return self._sse(events)
            time.sleep(TOKEN_DELAY_S * len(words))
            return self._json({"text": " ".join(words) + " ", "meta_info": {
                "id": "g", "prompt_tokens": 4, "completion_tokens": len(words),
                "finish_reason": {"type": "length", "length": len(words)}}})
        return self._json({})


def start(model_path):
    handler = type("Handler", (_Handler,), {"model_path": str(model_path)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server
