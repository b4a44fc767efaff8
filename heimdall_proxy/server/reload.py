"""Config hot reload: SIGHUP, or a change of the config file when `--watch-config` is on,
reads the file again and hands it to `Gateway.reload`.

A config that does not load or validate, or whose plugins fail to start, leaves the config in
force serving and is logged with the reason. Reloads never overlap: a signal that arrives
while one runs causes one more reload after it, so the last file written always wins. The
watch polls the file's modification time, size and inode (no extra dependency, and it sees
an editor's rename-over as well as an in-place write)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator

from aiohttp import web

from heimdall_proxy.config.gateway import ConfigError, load_config, require_endpoints
from heimdall_proxy.server.gateway import GATEWAY, Gateway

log = logging.getLogger(__name__)

_Stamp = tuple[int, int, int] | None


def _stamp(path: str) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ConfigReloader:
    """Reloads `path` into `gateway` on request; `lifespan` wires SIGHUP and the watch."""

    def __init__(self, gateway: Gateway, path: str, watch_interval: float = 0.0) -> None:
        self.gateway = gateway
        self.path = path
        self.watch_interval = watch_interval
        #: Reloads that swapped the config, and those rejected (tests and logs read these).
        self.applied = 0
        self.rejected = 0
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def request(self) -> None:
        """Ask for a reload (signal-handler safe: it only sets a flag)."""
        self._wanted.set()

    async def reload_once(self) -> bool:
        """Load, validate and swap the file's config now; False (logged) when rejected."""
        try:
            config = load_config(self.path)
            require_endpoints(config)
            await self.gateway.reload(config)
        except ConfigError as exc:
            self.rejected += 1
            log.error("config reload rejected, the config in force stays: %s", exc)
            return False
        except Exception as exc:
            self.rejected += 1
            log.exception("config reload failed, the config in force stays: %s", exc)
            return False
        self.applied += 1
        log.info(
            "config reloaded from %s: %d endpoints, %d plugins (state kept: %s)",
            self.path,
            len(config.endpoints),
            len(self.gateway.plugins.plugins),
            ", ".join(self.gateway.routing.inherited) or "none",
        )
        return True

    async def _run(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self.reload_once()

    async def _watch(self) -> None:
        last = _stamp(self.path)
        while True:
            await asyncio.sleep(self.watch_interval)
            now = _stamp(self.path)
            if now is not None and now != last:
                log.info("config file %s changed; reloading", self.path)
                self.request()
            last = now

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup_ctx: SIGHUP requests a reload; the watch, when on, polls the file."""
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(self._run())]
        if self.watch_interval > 0:
            tasks.append(asyncio.create_task(self._watch()))
        hooked = False
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, self.request)
            hooked = True
        try:
            yield
        finally:
            if hooked:
                loop.remove_signal_handler(signal.SIGHUP)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


#: The app's reloader, when the gateway was started from a config file.
RELOADER = web.AppKey("reloader", ConfigReloader)


def install_reloader(app: web.Application, path: str, watch_interval: float) -> ConfigReloader:
    reloader = ConfigReloader(app[GATEWAY], path, watch_interval)
    app[RELOADER] = reloader
    app.cleanup_ctx.append(reloader.lifespan)
    return reloader
