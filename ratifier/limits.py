"""`ratifier limits`: the admission limits in force (published with the policy set, or the
local folder's with ``--local``) and the fleet's current usage of each live bucket in Redis
(tokens left as last written, concurrency slots held)."""

from __future__ import annotations

from commands.limits import LimitSet, describe
from config.settings import Settings
from feeds.policies import PolicyFeed, local_policies
from runtime.limit_usage import limit_usage


async def limits_in_force(settings: Settings, *, local: bool) -> tuple[str, LimitSet]:
    policies = local_policies(settings)
    if local:
        return f"local folder ({policies.version})", policies.limits
    feed = PolicyFeed(settings, policies)
    await feed.catch_up(announce=False)
    return f"{feed.origin} ({feed.current.version})", feed.current.limits


async def report(settings: Settings, *, local: bool, tenant: str | None) -> list[str]:
    origin, limits = await limits_in_force(settings, local=local)
    lines = [f"limits in force: {origin}"]
    lines += [f"  {line}" for line in describe(limits)] or ["  (none: every call is admitted)"]
    live = await limit_usage(settings, tenant=tenant)
    lines.append(f"usage ({len(live)} live bucket(s)):")
    lines += [f"  {bucket:<48} {held}" for bucket, held in live]
    return lines
