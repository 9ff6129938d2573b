"""chat_frontend package."""
