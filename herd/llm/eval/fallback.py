"""Fallbacks: an ordered list of models a batch's calls move to while its model is
unavailable, and back once it recovers.

A batch names them as ``provider:model`` (``--fallback anthropic:claude-haiku-4-5``,
``"fallbacks"`` in ``POST /evals``); each is the batch's spec with that provider and
model (the same prompt, schema and params). A model is unavailable when a call to it
fails past the provider client's retries with a 5xx or 529 or a connection that never
answers, when the provider refuses its key or model (401, 403, 404), or when a 429 asks
for a pause longer than HERD_FALLBACK_AFTER. The call then goes to the next model in the
list, and the model is passed over by this process for HERD_FALLBACK_COOLDOWN seconds;
after that one call tries it again, and it is back when that call is answered.

An answer is cached under the key of the model that gave it (herd.llm.eval.spec.
EvalSpec.key names the provider and model), so it is never served as another model's:
the primary's key is looked up first, a fallback's answer fills the fallback's key.
Each call's ledger row names its model and is priced at its model's price, against the
batch's one budget. The last model in the list has no fallback: its failures are the
job's, as without fallbacks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from herd.app import App
from herd.errors import InvalidInput
from herd.jsonvalue import check_text
from herd.limits import LimitsFile
from herd.llm.errors import MissingAPIKey, ProviderAuthError, ProviderError, ProviderUnavailable
from herd.llm.eval.spec import EvalSpec
from herd.llm.pricing import PriceTable
from herd.llm.providers import registry

log = logging.getLogger("herd.eval")

MAX_FALLBACKS = 4


class ModelUnavailable(Exception):
    """This call's model is unavailable and the batch has a fallback to move to."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse(text: str) -> tuple[str, str]:
    """``provider:model`` -> (provider, model); InvalidInput naming what is wrong."""
    check_text(text, "fallback")
    provider, sep, model = text.partition(":")
    if not sep or not model.strip():
        raise InvalidInput(
            f"fallback {text!r} must be provider:model (e.g. anthropic:claude-haiku-4-5)",
            field="fallbacks",
        )
    registry.kind(provider)  # an unknown provider is refused, naming the known ones
    return provider, model.strip()


def specs(spec: EvalSpec, fallbacks: Iterable[str]) -> list[EvalSpec]:
    """The batch's spec with each fallback's provider and model."""
    out = []
    for text in fallbacks:
        provider, model = parse(text)
        out.append(replace(spec, provider=provider, model=model))
    return out


def check(
    spec: EvalSpec,
    fallbacks: Sequence[str],
    *,
    budget: float | None,
    batch_api: bool,
    prices: PriceTable,
    limits_file: LimitsFile | None = None,
) -> list[str]:
    """Refuse, before anything is stored, fallbacks that could only fail: a malformed or
    repeated one, one whose key is not set, one without a price under a budget, and any
    through the Batch API (not kept there yet). Returns them as given."""
    if not fallbacks:
        return []
    if batch_api:
        raise InvalidInput(
            "batch_api: fallbacks are not kept through the Batch API yet; submit without"
            " one or the other",
            field="batch_api",
        )
    if len(fallbacks) > MAX_FALLBACKS:
        raise InvalidInput(f"at most {MAX_FALLBACKS} fallbacks", field="fallbacks")
    seen = {(spec.provider, spec.model)}
    for other in specs(spec, fallbacks):
        if (other.provider, other.model) in seen:
            raise InvalidInput(
                f"fallback {other.provider}:{other.model} is named twice (or is the batch's"
                " own model)",
                field="fallbacks",
            )
        seen.add((other.provider, other.model))
        try:
            # A key pool's keys are the fallback's (checked as HERD_LIMITS was read).
            if limits_file is None or not limits_file.pool_for(other.provider, other.model):
                registry.kind(other.provider).check_key()
        except MissingAPIKey as exc:
            raise InvalidInput(f"fallback {other.provider}:{other.model}: {exc}",
                               field="fallbacks") from None  # fmt: skip
        if budget is not None and prices.lookup(other.model, other.provider) is None:
            raise InvalidInput(
                f"fallback {other.provider}:{other.model} has no price, so the budget cannot"
                " be kept; add it to HERD_PRICES or submit without --budget",
                field="fallbacks",
            )
    return list(fallbacks)


def unavailable(exc: ProviderError) -> str | None:
    """Why ``exc`` (past the client's retries) makes its model unavailable; None when it
    is this call's failure only (a 400, an unreadable answer, a timeout that may have
    been billed)."""
    if isinstance(exc, ProviderAuthError) or exc.status in (401, 403, 404):
        return f"refused: {exc}"
    if isinstance(exc, ProviderUnavailable) or (exc.status is not None and exc.status >= 500):
        return f"unavailable: {exc}"
    return None


@dataclass
class Breaker:
    """Models this process passes over, until when (monotonic seconds)."""

    cooldown: float
    _until: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def name(spec: EvalSpec) -> str:
        return f"{spec.provider}:{spec.model}"

    def available(self, spec: EvalSpec) -> bool:
        """Whether a call may try ``spec``'s model: yes unless it is passed over; once its
        cooldown is over, one call tries it (the others keep to the fallback until that
        call is answered, or fails and passes it over again)."""
        name, now = self.name(spec), time.monotonic()
        until = self._until.get(name)
        if until is None:
            return True
        if until > now:
            return False
        self._until[name] = now + self.cooldown  # this caller probes it
        return True

    def passed_over(self, spec: EvalSpec) -> bool:
        """Whether ``spec``'s model is passed over now (read-only: no probe is taken)."""
        return self._until.get(self.name(spec), 0.0) > time.monotonic()

    def trip(self, spec: EvalSpec, reason: str) -> None:
        if self.name(spec) not in self._until:
            log.warning("%s: %s; moving to the fallback for %g s", self.name(spec),
                        reason, self.cooldown)  # fmt: skip
        self._until[self.name(spec)] = time.monotonic() + self.cooldown

    def recovered(self, spec: EvalSpec) -> None:
        if self._until.pop(self.name(spec), None) is not None:
            log.warning("%s: answering again; calls move back to it", self.name(spec))

    def public(self) -> dict[str, Any]:
        now = time.monotonic()
        return {k: round(v - now, 1) for k, v in self._until.items() if v > now}


def breaker_of(app: App) -> Breaker:
    """The process's breaker (one per app)."""
    found = app.state.get("eval.fallback")
    if not isinstance(found, Breaker):
        found = app.state["eval.fallback"] = Breaker(float(app.settings.fallback_cooldown))
    return found
