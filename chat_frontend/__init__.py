"""The chat frontend: the gateway users talk to (`kvtb serve frontend`).

Pure logic:
    auth.py, limits.py, sessions.py, conversation.py, openai_format.py, record.py, errors.py, settings.py,
    routing.py (which replica serves a turn: round_robin, least_loaded, kv_aware)
Service:
    chat_service.py    one turn from the user's request to the stored transcript (any transport)
    prompt.py          the token ids a turn sends (kept, first, or a resent whole conversation)
    admission.py       turns in flight: a fair share per user, round-robin across users, bounded waits
    store.py           sessions and transcripts in SQLite
    agent_client.py    the link to one SmartNIC agent (which serves the compute node's service)
    replicas.py        the replicas (agent and compute node pairs) as one agent: routing, failover, health
    frontend_servicer.py, http_api.py (the OpenAI API), metrics.py, system_stats.py
    node.py (`serve`), main.py
"""
