"""Progress of a long Spark stage on stderr: a bar of finished tasks, drawn while the stage runs.

Each replay stage ends with one line of counters (printed by its caller).  A
stage that runs longer than ``after`` seconds also gets a bar: redrawn in place
on a terminal, or a plain line every ``every`` seconds otherwise (logs, CI).
It polls Spark's status tracker for the jobs of the stage's job group, so the
driver learns task counts only, never data.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_groups = itertools.count()


class Progress:
    def __init__(self, spark: Any, say: Callable[[str], None], *, stream: TextIO | None = None,
                 after: float = 2.0, every: float = 30.0, poll: float = 0.5, width: int = 30) -> None:
        self.sc = spark.sparkContext
        self.say = say
        self.stream = stream if stream is not None else sys.stderr
        self.after, self.every, self.poll, self.width = after, every, poll, width

    @contextmanager
    def stage(self, label: str) -> Iterator[None]:
        group = f"flamestream-{next(_groups)}"
        self.sc.setJobGroup(group, label)
        done = threading.Event()
        thread = threading.Thread(target=self._watch, args=(group, label, done), daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.sc.setJobGroup("flamestream-idle", "")

    def tasks(self, group: str) -> tuple[int, int]:
        """(finished, total) tasks of the group's jobs so far."""
        tracker = self.sc.statusTracker()
        finished = total = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                stage_info = tracker.getStageInfo(stage)
                if stage_info is not None:
                    finished += stage_info.numCompletedTasks
                    total += stage_info.numTasks
        return finished, total

    def bar(self, label: str, finished: int, total: int, elapsed: float) -> str:
        filled = self.width * finished // total if total else 0
        return (f"replay: {label} [{'#' * filled}{'.' * (self.width - filled)}] {finished}/{total} tasks, "
                f"{int(elapsed) // 60}m{int(elapsed) % 60:02d}s")

    def _watch(self, group: str, label: str, done: threading.Event) -> None:
        started = time.monotonic()
        tty = self.stream.isatty()
        drawn = False
        last = started
        while not done.wait(self.poll):
            now = time.monotonic()
            if now - started < self.after:
                continue
            try:
                finished, total = self.tasks(group)
            except Exception:  # the context is stopping: nothing more to show
                return
            line = self.bar(label, finished, total, now - started)
            if tty:
                self.stream.write("\r" + line)
                self.stream.flush()
                drawn = True
            elif now - last >= self.every:
                self.say(line)
                last = now
        if drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
