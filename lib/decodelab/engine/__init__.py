"""Phase 4b — the serving loop over the paged model: requests, a torch-free scheduler, the
per-row sampler, the static batch, step graphs, streaming, metrics and the engine itself.

``from decodelab.engine import Engine`` (or any name of ``__all__``) imports the module holding
it on first use (:mod:`decodelab.core.lazy`), so ``import decodelab.engine.scheduler`` (or
``requests``) still does not pull in torch. The bench lives apart, in :mod:`.bench`.
"""

from decodelab.core.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "Engine": "engine",
    "EngineConfig": "config",
    "Request": "requests",
    "SamplingParams": "requests",
    "InvalidRequestError": "requests",
    "RequestHandle": "stream",
    "TokenEvent": "stream",
    "RequestError": "stream",
    "Scheduler": "scheduler",
    "SchedulerConfig": "scheduler",
    "SchedulePlan": "plan",
    "Metrics": "metrics",
})
