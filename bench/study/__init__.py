"""`kvtb study NAME`: the seeds' studies, one command each (poster, scalellm, paper, eviction, all).

Each study runs the real services (the real model; a tiny random Llama with --smoke), writes raw
JSON, PNG plots shaped like the seed's figures and a Markdown page that sets each of the seed's
claims beside our measurement (bench.study.report).
"""
