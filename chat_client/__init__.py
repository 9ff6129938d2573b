"""The user's command-line client: `kvtb chat`, `kvtb stats`, `kvtb trace` (talks to the frontend over gRPC)."""
