"""The chat frontend: the gateway users talk to (`kvtb serve frontend`).

Pure logic:
    auth.py, limits.py, sessions.py, conversation.py, openai_format.py, record.py, errors.py, settings.py,
    request_parsing.py and request_fields.py (a request's values; its fields' tables),
    completions_format.py, tokenize_format.py,
    routing.py (which replica serves a turn: round_robin, least_loaded, kv_aware)
Service:
    chat_service.py    one turn from the user's request to the stored transcript (any transport)
    prompt.py          the token ids a turn sends (kept, first, or a resent whole conversation)
    admission.py       turns in flight: a fair share per user, round-robin across users, bounded waits
    store.py           sessions and transcripts in SQLite
    agent_client.py    the link to one SmartNIC agent (which serves the compute node's service)
    replicas.py        the replicas (agent and compute node pairs) as one agent: routing, failover, health
    frontend_servicer.py, metrics.py, system_stats.py
    http_api.py        the OpenAI API's app: every route, each served by the module named for it
                       (chat_completions_api, completions_api, tokenize_api, server_info_api,
                       metrics_api), their errors in OpenAI's shape (http_errors)
    node.py (`serve`), main.py
"""
