"""/v1/models/{id} and /version in process (/v1/models and /health: test_http_api)."""
from .test_completions_api import TextEngine, run


def test_models_retrieve_and_version():
    async def scenario(client):
        ok = await client.get("/v1/models/fake")
        missing = await client.get("/v1/models/org/other-model")
        version = await client.get("/version")
        return ok.status, await ok.json(), missing.status, await missing.json(), await version.json()
    ok, model, missing_status, missing, version = run(TextEngine(), scenario)
    assert ok == 200 and model == {"id": "fake", "object": "model", "created": 0, "owned_by": "kvtestbed"}
    assert missing_status == 404 and missing["error"]["code"] == "model_not_found"
    assert "org/other-model" in missing["error"]["message"]
    import importlib.metadata
    assert version == {"version": importlib.metadata.version("kvtestbed")}
