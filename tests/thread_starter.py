"""Imported by a warm parent in tests/test_warm_parent.py: starts a thread, which makes
forking unsafe (the parent must refuse)."""

from __future__ import annotations

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="a stray thread", daemon=True).start()
