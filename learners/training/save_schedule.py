"""When the learner checkpoints: every `checkpoint.interval_s` and/or `every_updates`."""

from __future__ import annotations

import time

from srl_jax.config.operations import CheckpointConfig


class SaveSchedule:
    """Says when a save is due, and keeps the record of the saves made."""

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self.saved_step: int | None = None
        """Version of the newest checkpoint made or restored (None: none yet)."""
        self.saves = 0
        self.time_stalled = 0.0
        """Seconds training was held up by saves."""
        self._last_save = time.monotonic()

    def needed(self, version: int) -> bool:
        """Whether `version` is not checkpointed yet."""
        return version != self.saved_step

    def due(self, version: int) -> bool:
        """Whether to checkpoint `version` now."""
        saved = self.saved_step or 0
        if version == saved:
            return False
        by_time = self.config.interval_s > 0 and \
            time.monotonic() - self._last_save >= self.config.interval_s
        by_updates = self.config.every_updates > 0 and \
            version - saved >= self.config.every_updates
        return by_time or by_updates

    def saved(self, version: int, stall_s: float) -> None:
        self.saved_step, self._last_save = version, time.monotonic()
        self.saves += 1
        self.time_stalled += stall_s
