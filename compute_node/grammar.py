"""Structured output by constrained decoding: JSON (any object, or valid against a JSON schema)
compiled by llguidance into a grammar over the model's tokens, and the per-step token masks.

A reply under a grammar starts at the grammar's start (no leading whitespace) and ends with the
tokenizer's end-of-turn token (eos), which the grammar allows only where the JSON is complete;
once the JSON is complete eos is the only token allowed. Whitespace between JSON tokens is
allowed (the model's compact or indented habits both fit) but bounded to WHITESPACE_MAX_CHARS
at each place, so a small model cannot loop on blank lines. A request's grammar, once compiled,
is kept in a bounded LRU cache keyed by its spec: a repeated schema compiles once. A new schema
is compiled first in a child process with a deadline (CompileScreen), since llguidance's own
limits do not bound every schema's compile time.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time

import llguidance
import llguidance.hf
import numpy as np
import torch

logger = logging.getLogger(__name__)

MAX_SCHEMA_BYTES = 64 * 1024
CACHE_ENTRIES = 64
MAX_ERROR_CHARS = 400
WHITESPACE_MAX_CHARS = 24
# At most once at each place JSON allows whitespace (llguidance's whitespace_pattern semantics).
WHITESPACE_PATTERN = r"[\x20\x0A\x0D\x09]{1,%d}" % WHITESPACE_MAX_CHARS
ANY_OBJECT_SCHEMA = '{"type": "object"}'
NUMPY_DTYPES = (torch.float32, torch.float16, torch.float64)  # masked through a numpy view
# llguidance's bounds on one grammar: compile work, per-token mask work, lexer memory (1-2 kB a
# state). Tighter than its defaults on memory (250k states) since 64 grammars may be cached;
# errors without the parser's internal state, since their text goes back to the client.
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
              max_lexer_states=20_000, max_grammar_size=200_000, verbose_errors=False)


# llguidance's limits bound lexing, not every part of compiling a schema (an allOf of 30 patterns
# runs for minutes), and a thread cannot be stopped: a new schema is compiled first in a child
# process that is killed past COMPILE_TIMEOUT_S (or COMPILE_MEMORY_BYTES).
COMPILE_TIMEOUT_S = 3.0
COMPILE_MEMORY_BYTES = 2 << 30
COMPILE_QUEUE_TIMEOUT_S = 10.0  # waiting for the child while it compiles others' schemas
_SCREEN_CODE = """
import json, resource, sys
from llguidance import LLMatcher, LLParserLimits
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
limits = LLParserLimits(**json.loads(sys.argv[1]))
for line in sys.stdin:
    try:
        error = LLMatcher.validate_grammar(json.loads(line), None, limits=limits)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    sys.stdout.write(json.dumps(error) + "\\n")
    sys.stdout.flush()
"""


class GrammarError(ValueError):
    """A structured-output request that cannot be compiled, or a token its grammar forbids;
    the message says why (a compile error goes to the client as 400)."""


class GrammarBusy(GrammarError):
    """The compiler is busy with other schemas: the server's state, not the request's fault (retry)."""


class Matcher:
    """One sequence's position in its grammar. Used by the engine thread only.

    Invariant: once accept refused a token the grammar forbids, the matcher stays in error (every
    later accept raises) and its mask allows eos alone."""

    def __init__(self, ll_matcher: llguidance.LLMatcher, eos_token_id: int, vocab_size: int):
        self._ll = ll_matcher
        self._eos = eos_token_id
        self.vocab_size = vocab_size
        self._terminated = False

    def accept(self, token_id: int) -> None:
        """Advance by the sampled token; GrammarError if the grammar forbids it."""
        if self._terminated:
            raise GrammarError(f"token {token_id} after the end of the structured reply")
        if not 0 <= token_id < self.vocab_size:
            raise GrammarError(f"token {token_id} is outside the vocabulary of {self.vocab_size}")
        if not self._ll.consume_token(int(token_id)):
            raise GrammarError(f"token {token_id} breaks the structured output: {self.error()}")
        if token_id == self._eos:
            self._terminated = True

    def is_terminated(self) -> bool:
        """The grammar's end (eos) was accepted: the reply must stop now."""
        return self._terminated

    def is_complete(self) -> bool:
        """The JSON is complete: eos is the only token the grammar allows next."""
        return self._ll.is_stopped() and not self._ll.is_error()

    def eos_allowed(self) -> bool:
        """The grammar may end here (the JSON so far is a whole valid reply)."""
        return not self._terminated and self._ll.is_accepting()

    def error(self) -> str:
        """Why the matcher is in error ('' when it is not)."""
        return short_error(self._ll.get_error())


class GrammarCompiler:
    """Compiles StructuredOutput specs against one tokenizer. Thread-safe: the cache is guarded by
    a lock and compiles run outside it (llguidance releases the GIL), so two threads compiling
    one new spec at once may both compile it; the cache keeps CACHE_ENTRIES specs, LRU."""

    def __init__(self, tokenizer, vocab_size: int, cache_entries: int = CACHE_ENTRIES,
                 compile_timeout_s: float = COMPILE_TIMEOUT_S):
        if vocab_size < len(tokenizer):
            raise ValueError(f"vocab_size {vocab_size} is below the tokenizer's {len(tokenizer)} tokens")
        self.vocab_size = vocab_size  # the logits' width; tokens past the tokenizer's are never allowed
        self.eos_token_id = int(tokenizer.eos_token_id)
        self._ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                          eos_token=self.eos_token_id)
        self._limits = llguidance.LLParserLimits(**LIMITS)
        self._cache: collections.OrderedDict[tuple[str, str], llguidance.LLMatcher | str] = \
            collections.OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()
        self._screen = CompileScreen(compile_timeout_s)
        self.compilations = 0  # grammars compiled (cache misses)

    def close(self) -> None:
        """Stop the compile screen's child process."""
        self._screen.close()

    def matcher(self, structured) -> Matcher:
        """A fresh matcher at the start of the reply; GrammarError for a bad, oversized or
        uncompilable spec. structured: kvtb_proto.compute_pb2.StructuredOutput."""
        key = spec_key(structured)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
        if entry is None:
            entry = self._compile(key)
            if isinstance(entry, GrammarError):  # the screen was busy: not the schema's fault, not cached
                raise entry
            with self._lock:
                self._cache[key] = entry
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_entries:
                    self._cache.popitem(last=False)
        if isinstance(entry, str):  # a compile error, cached too: a bad schema resent costs nothing
            raise GrammarError(entry)
        return Matcher(entry.deep_copy(), self.eos_token_id, self.vocab_size)

    def _compile(self, key: tuple[str, str]) -> llguidance.LLMatcher | str | GrammarError:
        """A pristine matcher (copied for each request), the error message, or GrammarError
        when the compile screen is busy (not to be cached)."""
        with self._lock:
            self.compilations += 1
        kind, text = key
        try:
            schema = ANY_OBJECT_SCHEMA if kind == "json_object" else parse_schema(text)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                schema, overrides={"whitespace_pattern": WHITESPACE_PATTERN})
        except GrammarError as e:
            return str(e)
        except ValueError as e:
            return f"json_schema cannot be compiled: {e}"
        if kind == "json_schema":
            try:
                error = self._screen.check(grammar)
            except GrammarError as e:
                return e
            if error:
                return f"json_schema cannot be compiled: {short_error(error)}"
        ll_matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar, log_level=0, limits=self._limits)
        if ll_matcher.is_error():
            return f"json_schema cannot be compiled: {short_error(ll_matcher.get_error())}"
        for warning in ll_matcher.get_grammar_warnings():
            logger.info("json_schema compiled with a warning: %s", warning)
        return ll_matcher


class CompileScreen:
    """A child process that compiles grammars (without the tokenizer) and is killed when one takes
    over COMPILE_TIMEOUT_S; started when first needed, again after a kill. Thread-safe: one
    grammar at a time, callers queue on a lock for up to COMPILE_QUEUE_TIMEOUT_S."""

    def __init__(self, timeout_s: float = COMPILE_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def check(self, grammar: str) -> str:
        """llguidance's error for the grammar ('' when it compiles), or a message that it took too
        long or too much memory; GrammarError when the screen stays busy with other grammars."""
        if not self._lock.acquire(timeout=COMPILE_QUEUE_TIMEOUT_S):
            raise GrammarBusy("the schema compiler is busy with other schemas; retry later")
        try:
            return self._check(grammar)
        finally:
            self._lock.release()

    def _check(self, grammar: str) -> str:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SCREEN_CODE, json.dumps(LIMITS), str(COMPILE_MEMORY_BYTES)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            self._proc.stdin.write(json.dumps(grammar).encode() + b"\n")
            self._proc.stdin.flush()
            line = self._read_line(time.monotonic() + self.timeout_s)
        except BrokenPipeError:  # it died (out of memory) before reading all of it
            line = None
        if line is None:
            self.close()
            return f"compiling it took over {self.timeout_s:g} s or {COMPILE_MEMORY_BYTES >> 20} MiB"
        return json.loads(line)

    def _read_line(self, deadline: float) -> bytes | None:
        """The child's answer, or None past the deadline or when it died."""
        out = bytearray()
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while not out.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                out += chunk
        return bytes(out)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()  # our own child, by its handle
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
            self._proc = None


def spec_key(structured) -> tuple[str, str]:
    """(kind, schema text) of a StructuredOutput; GrammarError when it names no kind or is too big."""
    kind = structured.WhichOneof("kind")
    if kind == "json_object":
        if not structured.json_object:
            raise GrammarError("json_object must be true when set")
        return kind, ""
    if kind == "json_schema":
        size = len(structured.json_schema.encode())
        if size > MAX_SCHEMA_BYTES:
            raise GrammarError(f"json_schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted")
        return kind, structured.json_schema
    raise GrammarError("structured output names no kind (json_object or json_schema)")


def parse_schema(text: str) -> dict:
    """The schema as a dict; GrammarError if the text is not JSON or not a JSON object."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    except RecursionError:
        raise GrammarError("json_schema is nested too deeply") from None
    if not isinstance(schema, dict):
        raise GrammarError(f"json_schema must be a JSON object (a schema), got {type(schema).__name__}")
    return schema


def short_error(message: str) -> str:
    """llguidance's message without its non-verbose marker, cut to MAX_ERROR_CHARS (an error about
    a regex quotes the whole regex)."""
    message = message.replace("<non-verbose/>", "").strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."


def mask_logits(logits: torch.Tensor, rows: list[int], matchers: list[Matcher]) -> None:
    """In place: for each k, logits[rows[k]] of the tokens matchers[k] forbids next become -inf
    (one bitmask for the batch). logits: [batch, vocab_size]."""
    if len(rows) != len(matchers):
        raise ValueError(f"{len(rows)} rows for {len(matchers)} matchers")
    if not rows:
        return
    vocab = logits.shape[-1]
    for m in matchers:
        if m.vocab_size != vocab:
            raise ValueError(f"logits are {vocab} wide; a matcher was compiled for {m.vocab_size} tokens")
    words = (vocab + 31) // 32
    bitmask = np.zeros((len(rows), words), dtype="<i4")  # [rows, words]: bit j of word w = token 32w+j
    for k, m in enumerate(matchers):  # on this thread: no handoff to a pool a loaded CPU may delay
        m._ll.unsafe_compute_mask_ptr(bitmask[k].ctypes.data, words * 4)
    # Little-endian words: byte order, then bit order within a byte, follow token order.
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, count=vocab, bitorder="little")  # [rows, vocab]
    forbidden = allowed == 0
    if logits.device.type == "cpu" and logits.dtype in NUMPY_DTYPES:
        # numpy on a view, one thread: torch would split a 49k-wide op across its OpenMP team,
        # and one descheduled thread of it stalls the step by milliseconds on a shared CPU.
        view = logits.detach().numpy()  # [batch, vocab], the same memory
        for k, row in enumerate(rows):
            np.putmask(view[row], forbidden[k], -np.inf)
        return
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    logits[index] = logits[index].masked_fill(torch.from_numpy(forbidden).to(logits.device), float("-inf"))
