"""The models one gateway process serves, their names, and which one a request goes to.

One model (the common case): the front hands every request to its only Gateway after
``Gateway.check_model`` (on every POST route, TEI's included); nothing here runs per request. Several
models (``serve --model A --model B``): each has its own Gateway (replicas, tokenizer, spec) and
the front calls ``Catalog.pick`` with the body's ``model``: one dict lookup by name or, without
``model``, the first model of the kind the route needs (``RouteKind``). Names: each model answers
to its public id (its ``--served-model-name``, else the ``--model`` value as given) and to its
other aliases; two models may not share a name. What it does not own: HTTP (front.py), the
per-model state (core.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

from bouquet.config import ConfigError, ServeConfig
from bouquet.gateway.core import Gateway
from bouquet.gateway.errors import APIError, bad_request, cut, json_type
from bouquet.modelspec import ModelSpec

# The model a POST route needs: "embed" (/v1/embeddings: any embedding model, whose dense output
# is the default, a SPLADE model's sparse one when named), "dense" (TEI's /embed, /embed_all,
# /similarity, Cohere's /v2/embed: an embedding model with dense vectors, not SPLADE), "sparse"
# (/embed_sparse: the first embedding model with sparse output, a SPLADE model or bge-m3's heads,
# else the first embedding model), "score" (rerank / score routes; an embedding model scores by
# cosine where no scoring model is served), "any" (/tokenize, /decode). Without ``model``, "embed"
# and "dense" go to the first dense embedding model: a SPLADE model first in --model order took
# TEI's /embed, which it cannot answer, while a dense model was served.
RouteKind = Literal["embed", "dense", "sparse", "score", "any"]
_KIND_WORDS = {"embed": "an embedding model", "score": "a scoring model"}
_TASK = {"embed": "embed", "dense": "embed", "sparse": "embed", "score": "score"}  # the spec.task a route kind needs


def model_names(models: Sequence[tuple[ServeConfig, ModelSpec]]) -> list[tuple[str, frozenset[str]]]:
    """Each model's (public id, every name it answers to), in order, from its single-model config
    (``ServeConfig.per_model``) and spec: the first ``--served-model-name`` else the spec's id,
    plus the spec's id and every ``--served-model-name``.

    Raises ConfigError when two models share a name (the message names both models).
    """
    out: list[tuple[str, frozenset[str]]] = []
    owner: dict[str, tuple[int, str]] = {}  # name → (position of its --model, that --model's value)
    for k, (cfg, spec) in enumerate(models, 1):
        public_id = cfg.served_model_name[0] if cfg.served_model_name else spec.model_id
        names = frozenset({public_id, spec.model_id, *cfg.served_model_name})
        for n in sorted(names):
            if n in owner:
                j, first = owner[n]
                raise ConfigError(f"--model #{j} ({first}) and --model #{k} ({cfg.model}) are both named {n!r}; give "
                                  "each model its own --served-model-name (one per --model, in order)")
            owner[n] = (k, cfg.model)
        out.append((public_id, names))
    return out


@dataclass(frozen=True)
class Catalog:
    """The served models in ``--model`` order. ``by_name``: every name → its model;
    ``first_of``: route kind → the first model of that kind (the first model when none is)."""

    gateways: tuple[Gateway, ...]
    by_name: dict[str, Gateway]
    first_of: dict[str, Gateway]

    @classmethod
    def of(cls, gateways: Sequence[Gateway]) -> "Catalog":
        """Raises ValueError for an empty list."""
        if not gateways:
            raise ValueError("a gateway serves at least one model")
        by_name = {n: gw for gw in gateways for n in gw.names}
        first_of = {kind: next((gw for gw in gateways if gw.spec.task == kind), gateways[0]) for kind in _KIND_WORDS}
        first_of["embed"] = first_of["dense"] = next((gw for gw in gateways if gw.spec.task == "embed"
                                                      and not gw.spec.sparse), first_of["embed"])
        first_of["sparse"] = next((gw for gw in gateways if gw.spec.task == "embed"
                                   and (gw.spec.sparse or gw.spec.token_heads)), first_of["embed"])
        first_of["any"] = gateways[0]
        return cls(tuple(gateways), by_name, first_of)

    @property
    def single(self) -> bool:
        return len(self.gateways) == 1

    def find(self, model: Any) -> Gateway:
        """The model named ``model``. Raises APIError 400 for a non-string, 404 for an unknown name
        (listing the served ones)."""
        if self.single:
            self.gateways[0].check_model(model)  # today's single-model messages
            return self.gateways[0]
        gw = self.by_name.get(model) if isinstance(model, str) else None
        if gw is None:
            if not isinstance(model, str):
                raise bad_request(f"'model' must be a string, got {json_type(model)}", "model", "invalid_type")
            served = ", ".join(f"'{g.public_id}'" for g in self.gateways)
            raise APIError(404, f"The model '{cut(model)}' does not exist; this server serves {served}", "model",
                           "model_not_found")
        return gw

    def pick(self, model: Any, kind: RouteKind) -> Gateway:
        """The model a request goes to (several models served): ``model`` when given, else the first
        of ``kind``. Raises APIError (``find``'s, or 400 ``wrong_task`` when ``model`` is of the
        other kind, or a SPLADE model on a dense route, while a model of the fitting kind is served;
        the message names that one)."""
        if model is None:
            return self.first_of[kind]
        gw = self.find(model)
        task = _TASK.get(kind)
        fit = self.first_of[kind]
        if task is not None and gw.spec.task != task:
            if fit.spec.task == task:
                raise bad_request(f"model '{model}' is {_KIND_WORDS[gw.spec.task]} and this route needs "
                                  f"{_KIND_WORDS[task]}: use model '{fit.public_id}'", "model", "wrong_task")
        elif kind == "dense" and gw.spec.sparse and fit.spec.task == "embed" and not fit.spec.sparse:
            raise bad_request(f"model '{model}' is a sparse (SPLADE) model and this route needs a dense embedding "
                              f"model: use model '{fit.public_id}', or /embed_sparse", "model", "wrong_task")
        return gw
