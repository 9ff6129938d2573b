"""/tokenize and /detokenize in process over test_completions_api's TextEngine."""
from .test_completions_api import BOS, TextEngine, post, run


def test_tokenize_and_detokenize():
    engine = TextEngine()
    status, body = run(engine, post("/tokenize", {"model": "fake", "prompt": "ab cde", "return_token_strs": True}))
    assert status == 200, body
    assert body == {"count": 3, "max_model_len": 200, "tokens": [BOS, 12, 13], "token_strs": ["", "xx", "xxx"]}
    status, body = run(engine, post("/tokenize", {"prompt": "ab", "add_special_tokens": False}))
    assert body["tokens"] == [12] and body["token_strs"] is None
    status, body = run(engine, post("/tokenize", {"messages": [{"role": "user", "content": "a b"}]}))
    assert status == 200 and body["tokens"] == [1, 11, 11, 4] and engine.encoded[-1].add_generation_prompt
    status, body = run(engine, post("/detokenize", {"model": "fake", "tokens": [12, 13]}))
    assert (status, body) == (200, {"prompt": "xx xxx"})
    for path, bad, param in [("/tokenize", {"prompt": "x", "messages": []}, "prompt"),
                             ("/tokenize", {"prompt": "x", "chat_template": "{{x}}"}, "chat_template"),
                             ("/tokenize", {"prompt": 3}, "prompt"),
                             ("/detokenize", {"tokens": [-1]}, "tokens"),
                             ("/detokenize", {"tokens": [1], "extra": 1}, "extra"),
                             ("/detokenize", {"model": "other", "tokens": [1]}, "model")]:
        status, body = run(engine, post(path, bad))
        assert status in (400, 404) and body["error"]["param"] == param, (path, bad, body)
    assert run(engine, post("/detokenize", {"tokens": [1]}, {}))[0] == 401
