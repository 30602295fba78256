"""Prediction files: what is predicted, about which runs, how it is scored, and who could see what.

Why a file format of its own: a prediction is worth something only if it was fixed before its
outcome existed and is scored by the rule it was frozen with. So each prediction carries, in one
committed file, everything the scorer needs and nothing it may choose later: the quantity, the runs
or test it is about, the predicted value or probability, its tolerance or scoring rule (the
declaration inside the file decides hit or miss; any other table is descriptive), its source (the
simulator over N fresh seeds at the engine model's commit, model F driven by the exact frozen
plans, the first-principles entry model, or a transcription), and a statement of what the
predictor could see when it predicted. `docs/predictions.md` documents the format.

The file is YAML (JSON is valid YAML), `format: agentload-prediction-set`, `format_version: 1`.
Loading is strict: unknown keys, a probability outside [0, 1], an inf or NaN anywhere, a rule
clause naming an unknown prediction, two predictions with one id are errors that name the file, the field, the value and
what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.config import check_finite
from harness.config.files import safe_load
from harness.errors import ConfigError

FORMAT = "agentload-prediction-set"
FORMAT_VERSION = 1

# Prediction kinds and the payload keys each needs (beyond the common ones).
KINDS: dict[str, tuple[str, ...]] = {
    "probability": ("event", "probability"),  # P(event) for a binary event of the quantity
    "categorical": ("probabilities",),  # a distribution over the quantity's categories
    "call": ("value",),  # a deterministic categorical call (a state, a verdict, a flag)
    "value": ("value", "tolerance"),  # a number with a declared tolerance
    "closest": ("value", "comparators"),  # hit iff the prediction is strictly closest of all candidates
    "rule_probability": ("rule",),  # P(rule holds) from per-seed probabilities of independent runs
}
SCOPES = ("run", "seed", "rate", "test", "measurement")
SOURCES = ("simulator", "model_f", "entry_model", "transcribed", "declared")
TOLERANCE_KEYS = ("abs", "rel", "rel_of_offset", "interval")
DECLARABLE_BLINDNESS = ("blind by access only",)
# How sure a simulator prediction is (prereg/margin_record.py): its `margin` block's label.
MARGIN_LABELS = ("robust", "knife-edge", "unjudged")

_TOP_KEYS = {
    "format",
    "format_version",
    "name",
    "test",
    "registration",
    "description",
    "made_at",
    "predictor",
    "could_see",
    "declared_blindness",
    "scoring_declaration",
    "margins",
    "predictions",
}
_PRED_KEYS = {
    "id",
    "quantity",
    "about",
    "kind",
    "layer",
    "source",
    "note",
    "event",
    "probability",
    "probabilities",
    "value",
    "tolerance",
    "transform",
    "comparators",
    "rule",
    "margin",
}
_ABOUT_KEYS = {"scope", "arm", "rate", "seed", "target"}


class PredictionError(ConfigError):
    """A prediction file is malformed (the message names file, field, value and what was expected)."""


def _err(path: str, where: str, value: Any, expected: str) -> PredictionError:
    return PredictionError(f"{path}: {where}: got {value!r}; expected {expected}")


@dataclass(frozen=True)
class About:
    """What a prediction is about: one run (arm, rate, seed), one seed at a rate, one rate, the whole
    test, or a measurement outside the test's runs (a calibration curve, `target` names it)."""

    scope: str
    arm: str | None = None
    rate: float | None = None
    seed: int | None = None
    target: str | None = None

    def key(self) -> tuple[Any, ...]:
        """The identity outcomes are matched on (arm names are case-insensitive)."""
        return (self.scope, self.arm.upper() if self.arm else None, _rate_key(self.rate), self.seed, self.target)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scope": self.scope}
        for k in ("arm", "rate", "seed", "target"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.to_dict().items() if k != "scope"]
        return f"{self.scope}({', '.join(parts)})" if parts else self.scope


def _rate_key(rate: float | None) -> float | None:
    return None if rate is None else round(float(rate), 6)


@dataclass(frozen=True)
class Prediction:
    """One frozen prediction. `payload` holds the kind's keys (event, probability, value, ...)."""

    id: str
    quantity: str
    about: About
    kind: str
    source: dict[str, Any]
    payload: dict[str, Any]
    layer: str = "default"
    note: str = ""
    margin: dict[str, Any] | None = None  # flip margins and their label (absent in files made before them)

    @property
    def margin_label(self) -> str | None:
        """robust | knife-edge | unjudged, or None for a prediction without margins."""
        return None if self.margin is None else str(self.margin["label"])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "quantity": self.quantity,
            "about": self.about.to_dict(),
            "kind": self.kind,
        }
        if self.layer != "default":
            out["layer"] = self.layer
        out.update(self.payload)
        out["source"] = self.source
        if self.margin is not None:
            out["margin"] = self.margin
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class PredictionFile:
    """A whole prediction file, as frozen."""

    name: str
    test: str | None
    registration: dict[str, Any] | None
    made_at: str | None
    predictor: dict[str, Any]
    could_see: list[str]
    predictions: list[Prediction]
    description: str = ""
    declared_blindness: dict[str, Any] | None = None
    scoring_declaration: str = ""
    path: str = ""
    margins: dict[str, Any] | None = None  # how the margins were found: tolerance, largest change, noise

    def by_id(self) -> dict[str, Prediction]:
        return {p.id: p for p in self.predictions}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, "name": self.name}
        if self.description:
            out["description"] = self.description
        out["test"] = self.test
        out["registration"] = self.registration
        out["made_at"] = self.made_at
        out["predictor"] = self.predictor
        out["could_see"] = list(self.could_see)
        if self.declared_blindness is not None:
            out["declared_blindness"] = self.declared_blindness
        if self.scoring_declaration:
            out["scoring_declaration"] = self.scoring_declaration
        if self.margins is not None:
            out["margins"] = self.margins
        out["predictions"] = [p.to_dict() for p in self.predictions]
        return out


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
def load_predictions(path: str | Path) -> PredictionFile:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise PredictionError(f"{p}: cannot read the prediction file ({exc.strerror})") from None
    return parse_predictions(data, str(p))


def parse_predictions(data: bytes | str, path: str = "<predictions>") -> PredictionFile:
    """Parse and validate a prediction file's bytes (e.g. the bytes a freeze tag holds)."""
    try:
        doc = safe_load(data)
    except yaml.YAMLError as exc:
        raise PredictionError(f"{path}: not valid YAML ({exc})") from None
    return predictions_from_doc(doc, path)


def predictions_from_doc(doc: Any, path: str = "<predictions>") -> PredictionFile:
    """Validate a prediction file's parsed YAML document (for a reader that has parsed it already:
    a freeze's files are parsed once, then asked what kind of file each is)."""
    if not isinstance(doc, dict):
        raise _err(path, "top level", type(doc).__name__, "a mapping with format: agentload-prediction-set")
    if doc.get("format") != FORMAT:
        raise _err(path, "format", doc.get("format"), f"{FORMAT!r}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise _err(path, "format_version", doc.get("format_version"), str(FORMAT_VERSION))
    check_finite(doc, path, PredictionError)
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise _err(path, "top-level keys", unknown, f"only {sorted(_TOP_KEYS)}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise _err(path, "name", name, "a non-empty string")
    could_see = doc.get("could_see")
    if not isinstance(could_see, list) or not could_see or not all(isinstance(x, str) and x for x in could_see):
        raise _err(path, "could_see", could_see, "a non-empty list of statements of what the predictor could see")
    predictor = doc.get("predictor") or {}
    if not isinstance(predictor, dict):
        raise _err(path, "predictor", predictor, "a mapping (source kind, code commit, command, parameters)")
    reg = doc.get("registration")
    if reg is not None and (not isinstance(reg, dict) or not isinstance(reg.get("sha256"), str)):
        raise _err(path, "registration", reg, "null or a mapping with at least sha256 (and name, path)")
    blind = doc.get("declared_blindness")
    if blind is not None and (
        not isinstance(blind, dict) or blind.get("label") not in DECLARABLE_BLINDNESS or not blind.get("statement")
    ):
        raise _err(
            path,
            "declared_blindness",
            blind,
            f"null or {{label: one of {list(DECLARABLE_BLINDNESS)}, statement: who read what, when}}",
        )
    margins = doc.get("margins")
    if margins is not None and (not isinstance(margins, dict) or not _is_num(margins.get("tolerance"))):
        raise _err(path, "margins", margins, "null or a mapping with tolerance, max_change and noise (the bisection's)")
    preds_raw = doc.get("predictions")
    if not isinstance(preds_raw, list) or not preds_raw:
        raise _err(path, "predictions", preds_raw, "a non-empty list")
    preds = [_parse_prediction(path, i, x) for i, x in enumerate(preds_raw)]
    ids = [p.id for p in preds]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise _err(path, "predictions[].id", dup, "unique ids")
    pf = PredictionFile(
        name=name,
        test=doc.get("test"),
        registration=reg,
        made_at=None if doc.get("made_at") is None else str(doc.get("made_at")),
        predictor=predictor,
        could_see=could_see,
        predictions=preds,
        description=str(doc.get("description") or ""),
        declared_blindness=blind,
        scoring_declaration=str(doc.get("scoring_declaration") or ""),
        path=path,
        margins=margins,
    )
    for p in preds:
        if p.kind == "rule_probability":
            _check_rule(path, p, pf.by_id())
    return pf


def _parse_prediction(path: str, i: int, x: Any) -> Prediction:
    where = f"predictions[{i}]"
    if not isinstance(x, dict):
        raise _err(path, where, x, "a mapping")
    unknown = sorted(set(x) - _PRED_KEYS)
    if unknown:
        raise _err(path, f"{where} keys", unknown, f"only {sorted(_PRED_KEYS)}")
    pid = x.get("id")
    if not isinstance(pid, str) or not pid:
        raise _err(path, f"{where}.id", pid, "a non-empty string")
    where = f"predictions[{pid}]"
    kind = x.get("kind")
    if kind not in KINDS:
        raise _err(path, f"{where}.kind", kind, f"one of {list(KINDS)}")
    quantity = x.get("quantity")
    if not isinstance(quantity, str) or not quantity:
        raise _err(path, f"{where}.quantity", quantity, "the name of the measured quantity (e.g. state, stuck, slope)")
    about = _parse_about(path, where, x.get("about"))
    source = x.get("source")
    if not isinstance(source, dict) or source.get("kind") not in SOURCES:
        raise _err(path, f"{where}.source", source, f"a mapping with kind one of {list(SOURCES)}")
    for key in KINDS[kind]:
        if key not in x:
            raise _err(path, f"{where}.{key}", None, f"present for a {kind} prediction")
    payload = {
        k: x[k]
        for k in ("event", "probability", "probabilities", "value", "tolerance", "transform", "comparators", "rule")
        if k in x
    }
    _check_payload(path, where, kind, payload)
    margin = x.get("margin")
    if margin is not None:
        _check_margin(path, where, margin)
    return Prediction(
        pid,
        quantity,
        about,
        kind,
        dict(source),
        payload,
        str(x.get("layer") or "default"),
        str(x.get("note") or ""),
        margin,
    )


def _check_margin(path: str, where: str, m: Any) -> None:
    """A prediction's `margin` block: a label, the smallest margin, and per knob the changes (or null)."""
    if not isinstance(m, dict) or m.get("label") not in MARGIN_LABELS:
        raise _err(path, f"{where}.margin", m, f"a mapping with label one of {list(MARGIN_LABELS)}")
    if not _is_num(m.get("margin")) or m["margin"] < 0:
        raise _err(path, f"{where}.margin.margin", m.get("margin"), "the smallest flip margin, a relative change >= 0")
    for knob in ("speed", "lambda_ref"):
        k = m.get(knob)
        if k is None:
            continue
        if not isinstance(k, dict) or not all(v is None or (_is_num(v) and v >= 0) for v in k.values()):
            raise _err(path, f"{where}.margin.{knob}", k, "a mapping side -> relative change >= 0 or null")


def _parse_about(path: str, where: str, a: Any) -> About:
    if not isinstance(a, dict):
        raise _err(path, f"{where}.about", a, "a mapping with scope (run | seed | rate | test | measurement)")
    unknown = sorted(set(a) - _ABOUT_KEYS)
    if unknown:
        raise _err(path, f"{where}.about keys", unknown, f"only {sorted(_ABOUT_KEYS)}")
    scope = a.get("scope")
    if scope not in SCOPES:
        raise _err(path, f"{where}.about.scope", scope, f"one of {list(SCOPES)}")
    need = {
        "run": ("arm", "rate", "seed"),
        "seed": ("rate", "seed"),
        "rate": ("rate",),
        "test": (),
        "measurement": ("target",),
    }[scope]
    for k in need:
        if a.get(k) is None:
            raise _err(path, f"{where}.about.{k}", None, f"present for scope {scope}")
    rate = a.get("rate")
    if rate is not None and (not isinstance(rate, (int, float)) or rate <= 0):
        raise _err(path, f"{where}.about.rate", rate, "a positive multiple of lambda_ref")
    seed = a.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _err(path, f"{where}.about.seed", seed, "an integer seed")
    return About(
        scope,
        None if a.get("arm") is None else str(a["arm"]),
        None if rate is None else float(rate),
        seed,
        None if a.get("target") is None else str(a["target"]),
    )


def _is_prob(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0.0 <= v <= 1.0


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_payload(path: str, where: str, kind: str, pl: dict[str, Any]) -> None:
    if kind == "probability":
        ev = pl["event"]
        if not isinstance(ev, dict) or set(ev) != {"equals"}:
            raise _err(path, f"{where}.event", ev, "{equals: VALUE} (the event is: the quantity equals VALUE)")
        if not _is_prob(pl["probability"]):
            raise _err(path, f"{where}.probability", pl["probability"], "a number in [0, 1]")
    elif kind == "categorical":
        ps = pl["probabilities"]
        if not isinstance(ps, dict) or not ps or not all(_is_prob(v) for v in ps.values()):
            raise _err(path, f"{where}.probabilities", ps, "a mapping category -> probability in [0, 1]")
        if abs(sum(ps.values()) - 1.0) > 1e-6:
            raise _err(path, f"{where}.probabilities", ps, "probabilities summing to 1")
    elif kind in ("value", "closest"):
        if not _is_num(pl["value"]):
            raise _err(path, f"{where}.value", pl["value"], "a finite number")
        if kind == "value":
            _check_tolerance(path, where, pl["tolerance"])
        else:
            c = pl["comparators"]
            if not isinstance(c, dict) or not c or not all(_is_num(v) for v in c.values()):
                raise _err(
                    path, f"{where}.comparators", c, "a mapping name -> finite number (the competing predictions)"
                )
        tr = pl.get("transform")
        if tr is not None and (
            not isinstance(tr, dict) or set(tr) != {"origin", "factor"} or not all(_is_num(v) for v in tr.values())
        ):
            raise _err(
                path, f"{where}.transform", tr, "{origin: x0, factor: k} (predicted value read as x0 + k (value - x0))"
            )
    elif kind == "call":
        v = pl["value"]
        if not isinstance(v, (str, bool, int)):
            raise _err(path, f"{where}.value", v, "a category (string, boolean or integer)")
    if "probability" in pl and kind == "rule_probability" and not _is_prob(pl["probability"]):
        raise _err(path, f"{where}.probability", pl["probability"], "a number in [0, 1] (the stated rule probability)")


def _check_tolerance(path: str, where: str, tol: Any) -> None:
    if not isinstance(tol, dict) or not tol:
        raise _err(path, f"{where}.tolerance", tol, f"a mapping with one of {list(TOLERANCE_KEYS)}")
    kinds = [k for k in tol if k in TOLERANCE_KEYS]
    extra = sorted(set(tol) - set(TOLERANCE_KEYS) - {"origin"})
    if len(kinds) != 1 or extra:
        raise _err(
            path, f"{where}.tolerance", tol, f"exactly one of {list(TOLERANCE_KEYS)} (rel_of_offset with origin)"
        )
    k = kinds[0]
    v = tol[k]
    if k == "interval":
        if not (isinstance(v, list) and len(v) == 2 and all(_is_num(x) for x in v) and v[0] <= v[1]):
            raise _err(path, f"{where}.tolerance.interval", v, "[low, high] with low <= high")
    elif not _is_num(v) or v < 0:
        raise _err(path, f"{where}.tolerance.{k}", v, "a non-negative number")
    if k == "rel_of_offset" and not _is_num(tol.get("origin")):
        raise _err(path, f"{where}.tolerance.origin", tol.get("origin"), "the origin x0 of |x - v| <= rel (v - x0)")


def _check_rule(path: str, p: Prediction, by_id: Mapping[str, Prediction]) -> None:
    where = f"predictions[{p.id}].rule"
    leaves: list[str] = []

    def walk(c: Any, w: str) -> None:
        if not isinstance(c, dict):
            raise _err(
                path,
                w,
                c,
                "a clause: {all: [...]}, {any: [...]}, {at_least: k, of: [...]} or {prediction: id, is: bool}",
            )
        if "prediction" in c:
            if set(c) != {"prediction", "is"} or not isinstance(c["is"], bool):
                raise _err(path, w, c, "{prediction: id, is: true | false}")
            target = by_id.get(c["prediction"])
            if target is None or target.kind != "probability":
                raise _err(path, w + ".prediction", c["prediction"], "the id of a probability prediction in this file")
            leaves.append(c["prediction"])
        elif "at_least" in c:
            if set(c) != {"at_least", "of"} or not isinstance(c["at_least"], int) or not isinstance(c["of"], list):
                raise _err(path, w, c, "{at_least: k, of: [clauses]}")
            if not 0 <= c["at_least"] <= len(c["of"]):
                raise _err(path, w + ".at_least", c["at_least"], f"between 0 and {len(c['of'])}")
            for j, s in enumerate(c["of"]):
                walk(s, f"{w}.of[{j}]")
        elif set(c) in ({"all"}, {"any"}):
            subs = c.get("all", c.get("any"))
            if not isinstance(subs, list) or not subs:
                raise _err(path, w, c, "a non-empty list of clauses")
            for j, s in enumerate(subs):
                walk(s, f"{w}[{j}]")
        else:
            raise _err(
                path,
                w,
                c,
                "a clause: {all: [...]}, {any: [...]}, {at_least: k, of: [...]} or {prediction: id, is: bool}",
            )

    walk(p.payload["rule"], where)
    dup = sorted({x for x in leaves if leaves.count(x) > 1})
    if dup:
        raise _err(
            path, where, dup, "each per-run prediction used once (the rule's probability assumes independent runs)"
        )
    runs = [by_id[x].about.key() for x in leaves]
    if len(set(runs)) != len(runs):
        raise _err(path, where, [by_id[x].about.label() for x in leaves], "clauses about distinct runs (independence)")


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------
class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared sub-mappings out in full: a reader should never chase YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_predictions(pf: PredictionFile | Mapping[str, Any]) -> bytes:
    """The file's bytes: YAML in a fixed key order, so equal predictions give identical bytes."""
    doc = pf.to_dict() if isinstance(pf, PredictionFile) else dict(pf)
    text = yaml.dump(
        doc, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100
    )
    data = text.encode("utf-8")
    parse_predictions(data, "<generated predictions>")  # never write a file the loader would refuse
    return data


def write_predictions(pf: PredictionFile | Mapping[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(dump_predictions(pf))
    return p


def make_file(
    name: str,
    predictions: Sequence[Prediction],
    *,
    test: str | None,
    registration: Mapping[str, Any] | None,
    predictor: Mapping[str, Any],
    could_see: Sequence[str],
    made_at: str | None = None,
    description: str = "",
    scoring_declaration: str = "",
    declared_blindness: Mapping[str, Any] | None = None,
    margins: Mapping[str, Any] | None = None,
) -> PredictionFile:
    return PredictionFile(
        name=name,
        test=test,
        registration=None if registration is None else dict(registration),
        made_at=made_at,
        predictor=dict(predictor),
        could_see=list(could_see),
        predictions=list(predictions),
        description=description,
        declared_blindness=None if declared_blindness is None else dict(declared_blindness),
        scoring_declaration=scoring_declaration,
        margins=None if margins is None else dict(margins),
    )


def leaves_of(rule: Mapping[str, Any]) -> list[str]:
    """The per-run prediction ids a rule clause tree refers to, in order."""
    if "prediction" in rule:
        return [rule["prediction"]]
    subs = rule.get("of") or rule.get("all") or rule.get("any") or []
    return [x for s in subs for x in leaves_of(s)]
