"""The chat client's tests talk to a real frontend process in front of a fake agent."""
from tests.chat_frontend.test_http_api import frontend  # noqa: F401 (the fixture)
