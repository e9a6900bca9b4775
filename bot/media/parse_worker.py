"""The parse worker's main loop: one job at a time from a pipe, under its own limits.

A spawned process (a fresh interpreter: nothing of the server's state, sockets or threads)
imports only this module, bot.media.readers and the parsers. Its address space is capped
(RLIMIT_AS, so a bomb meets MemoryError here, not the OOM killer there); each job may use
``cpu_seconds`` more CPU than the worker had used (RLIMIT_CPU: SIGXCPU ends the process, the
pool starts another); no core files. Warnings and log records of the parsers go nowhere: what
a file did is the server's one ``attachment.*`` line, not raw stderr.
"""

from __future__ import annotations

import logging
import resource
import warnings

# job name -> reader; nothing else can be asked of a worker
JOBS = ("file", "image", "audio")


def serve(conn, cpu_seconds: float, memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    import importlib

    from bot.media import audio
    from bot.media import readers

    for name in ("PIL.Image", "PIL.PngImagePlugin", "PIL.JpegImagePlugin", "pypdf"):
        importlib.import_module(name)     # once per worker, not on its first job

    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        name, args = job
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        soft = int(used + cpu_seconds) + 1
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        try:
            if name == "file":
                result = ("ok", readers.read_file(*args))
            elif name == "image":
                result = ("ok", readers.read_image(*args))
            elif name == "audio":
                result = ("ok", audio.probe(*args))
            else:
                result = ("refused", "unreadable", f"unknown job {name!r}", "parser")
        except readers.Refused as e:
            result = ("refused", e.reason, e.detail, e.cause)
        except MemoryError:
            result = ("refused", "unreadable", f"over the worker's {memory_bytes >> 20} MB", "memory")
        except RecursionError:
            result = ("refused", "unreadable", "nested too deep", "parser")
        except Exception as e:  # noqa: BLE001 - any parser bug on any input: the file is unreadable
            result = ("refused", "unreadable", f"{type(e).__name__}: {e}"[:200], "parser")
        try:
            conn.send(result)
        except MemoryError:
            conn.send(("refused", "unreadable", "result too large", "memory"))
        del result
