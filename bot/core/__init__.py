"""The message path, transport-neutral: the inbound message, the handler (chat rules, then a
command or the agent), chat events (lifecycle), the Reply interface, answers in flight."""
