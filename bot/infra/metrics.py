"""Prometheus metrics (GET /metrics), one registry per app so tests can run several."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.events = Counter("ethan_events_received_total", "Lark events received, by outcome",
                              ["status"], registry=r)
        self.refused = Counter("ethan_webhook_refused_total", "Webhook requests refused", ["reason"],
                               registry=r)
        self.ignored = Counter("ethan_events_ignored_total", "Accepted events not answered", ["reason"],
                               registry=r)
        self.replies = Counter("ethan_replies_sent_total", "Replies handed to the transport", registry=r)
        self.model_calls = Counter("ethan_model_calls_total", "Chat model requests", registry=r)
        self.model_failures = Counter("ethan_model_failures_total", "Chat model failures", ["kind"],
                                      registry=r)
        # Which model answered, and what it cost (per provider and model, as the server named it)
        self.model_answers = Counter("ethan_model_answers_total", "Model answers, by who answered",
                                     ["provider", "model"], registry=r)
        self.model_tokens = Counter("ethan_model_tokens_total", "Model tokens by kind (input = uncached "
                                    "input; cache_read / cache_write = prompt-cache hits / writes)",
                                    ["provider", "model", "kind"], registry=r)
        self.model_fallbacks = Counter("ethan_model_fallbacks_total", "Turns a fallback model took over",
                                       ["from_model", "to_model", "kind"], registry=r)
        self.queue_depth = Gauge("ethan_consolidation_queue_depth", "Consolidation jobs waiting",
                                 registry=r)
        self.conversations = Gauge("ethan_active_conversations", "Conversations with queued work",
                                   registry=r)
        # The tool port (bot/tools/registry.py): outcome ok | error | timeout | declined
        self.tool_calls = Counter("ethan_tool_calls_total", "Tool calls, by tool and outcome",
                                  ["tool", "outcome"], registry=r)
        self.tool_latency = Histogram("ethan_tool_latency_seconds", "Tool call time, by tool", ["tool"],
                                      buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=r)
        self.latency = Histogram("ethan_reply_latency_seconds", "Time from handling start to reply",
                                 buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120), registry=r)
        # PostgreSQL (storage/postgres/stats.py UnitStats): units of work, round trips to the server,
        # replays of a unit that lost a race — what a database further away costs (issue 29).
        self.database = Gauge("ethan_database_work", "PostgreSQL work since start, by kind "
                              "(units, round_trips, retries)", ["kind"], registry=r)

        # Log lines stderr could not take (a closed pipe): bot/infra/log.py counts them, process-wide.
        self.log_dropped = Counter("ethan_log_lines_dropped_total", "Log lines dropped: stderr was "
                                   "closed or its reader gone", registry=r)
        self._log_dropped_seen = 0

    def log_lines_dropped(self, total: int) -> None:
        """Bring the counter up to the process's count (read at scrape time, not per line)."""
        if total > self._log_dropped_seen:
            self.log_dropped.inc(total - self._log_dropped_seen)
            self._log_dropped_seen = total

    def database_work(self, snapshot: dict) -> None:
        for kind in ("units", "round_trips", "retries"):
            self.database.labels(kind).set(snapshot.get(kind, 0))

    def count_response(self, response) -> None:
        labels = (response.provider or "?", response.model or "?")
        self.model_answers.labels(*labels).inc()
        u = response.usage
        for kind, n in (("input", u.input_tokens), ("output", u.output_tokens),
                        ("cache_read", u.cache_read_tokens), ("cache_write", u.cache_write_tokens)):
            if n:
                self.model_tokens.labels(*labels, kind).inc(n)

    def count_tool(self, tool: str, outcome: str, seconds: float) -> None:
        self.tool_calls.labels(tool, outcome).inc()
        self.tool_latency.labels(tool).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
