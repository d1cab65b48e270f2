"""vLLM plugin (entry point ``vllm.general_plugins``: kvpool_as_mooncake).

vLLM calls ``register()`` in every process it starts (engine core, workers).
With ``KVPOOL_AS_MOONCAKE=1`` it makes ``import mooncake.store`` resolve to
kvpool.mooncake, so vLLM's own MooncakeStoreConnector runs on kvpool.
Without the variable it does nothing."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("kvpool.plugin")


def register() -> None:
    if os.environ.get("KVPOOL_AS_MOONCAKE", "") not in ("1", "true", "True", "yes"):
        return
    from . import install_as_mooncake
    install_as_mooncake()
    log.info("kvpool: mooncake.store now resolves to kvpool.mooncake (KVPOOL_AS_MOONCAKE=1)")
