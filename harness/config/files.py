"""Reading config files: where a reference points, strict YAML, and validation with readable errors.

Generic over the models (harness/config/models.py), so the models can read the files they name
(a cell's cost_file) without a cycle. Errors name the file, the field path, the bad value and what
was expected.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from harness.config.finite import check_finite
from harness.errors import ConfigError

CONFIG_ROOT = Path(__file__).resolve().parent.parent.parent / "configs"
M = TypeVar("M", bound=BaseModel)


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _expected(e: Any) -> str:
    msg: str = e["msg"].removeprefix("Value error, ")
    if msg.startswith("Input should be "):
        msg = msg.removeprefix("Input should be ")
    return msg


def _format_errors(path: Path | str, err: ValidationError) -> str:
    lines = [f"{path}: invalid {err.title} configuration ({err.error_count()} error(s))"]
    for e in err.errors(include_url=False):
        loc = _fmt_loc(tuple(x for x in e["loc"] if x not in ("function-after", "function-before")))
        if e["type"] == "extra_forbidden":
            lines.append(
                f"  {loc}: unknown key (value {_short(e['input'])}); expected no such key: remove it or check its "
                "spelling"
            )
        elif e["type"] == "missing":
            lines.append(f"  {loc}: required field is missing; expected a value")
        elif e["type"] == "value_error":
            # model-level checks already name the values they compare; the input is the whole mapping
            lines.append(f"  {loc}: expected {_expected(e)}")
        else:
            lines.append(f"  {loc}: got {_short(e['input'])}; expected {_expected(e)}")
    return "\n".join(lines)


def parse_config(data: Any, model: type[M], source: Path | str = "<memory>") -> M:
    """Validate already-loaded data against `model`, raising ConfigError with a readable message.

    Files are validated strictly (no "60" -> 60 or 20.0 -> 20 coercion): a registered value should
    be exactly what its file says. References inside the file (cost_file) resolve relative to it.
    Infinite and NaN numbers are refused anywhere in the data, free-form mappings included
    (harness/config/finite.py).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    check_finite(data, source)
    base = Path(source).parent if str(source) != "<memory>" else None
    try:
        return model.model_validate(data, strict=True, context={"base": base})
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def resolve_path(ref: str | Path, base: Path | None = None) -> Path:
    """Find a referenced config: absolute, relative to `base`, to the cwd, or under configs/."""
    p = Path(ref)
    candidates = [p] if p.is_absolute() else [*(([base / p]) if base else []), Path.cwd() / p, CONFIG_ROOT / p]
    for c in candidates:
        if c.is_file():
            return c
        if c.with_suffix(".yaml").is_file():
            return c.with_suffix(".yaml")
    tried = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"config {str(ref)!r} not found (tried {tried})")


class _Checks:
    """Two fixes for configs, for either parser: a key given twice is an error (plain YAML keeps the
    last one silently), and `1e-3` is a float (YAML 1.1 reads it as a string)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[attr-defined]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (line {line}; first given on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc,no-any-return]


class _Loader(_Checks, yaml.SafeLoader):
    """Safe YAML with the config fixes, parsed in Python: the one whose errors a user reads."""


# libyaml's parser, where PyYAML was built with it: the same documents about ten times faster (a
# registration of 600 lines: ~0.12 s in Python, a `status` reads it twice). Its error messages lack
# the quoted line, so a document it refuses is read again by the Python parser for the message.
_CSafe: Any = getattr(yaml, "CSafeLoader", None)
_CLoader: Any = type("_CLoader", (_Checks, _CSafe), {}) if _CSafe is not None else None

_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
for _cls in (_Loader, _CLoader):
    if _cls is not None:
        _cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _load(text: str | bytes, python_loader: Any, c_loader: Any) -> Any:
    """`yaml.load(text, python_loader)`, through libyaml when it can give the same answer: the text
    has no character the Python reader refuses (libyaml lets some through), and libyaml accepts it.
    Anything else goes to the Python loader, whose result or error is then the answer."""
    if c_loader is not None:
        chars = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        if not yaml.reader.Reader.NON_PRINTABLE.search(chars):
            try:
                return yaml.load(text, Loader=c_loader)
            except yaml.YAMLError:
                pass
    return yaml.load(text, Loader=python_loader)


def safe_load(data: str | bytes) -> Any:
    """`yaml.safe_load(data)`, the same document or the same error, through libyaml where it can."""
    return _load(data, yaml.SafeLoader, _CSafe)


def load_yaml(path: Path | str) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return _load(text, _Loader, _CLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def config_ref(name: str, folder: str) -> str:
    """A bare name ('burst') means configs/<folder>/<name>.yaml; anything with a slash is a path."""
    return name if ("/" in name or name.endswith((".yaml", ".yml"))) else f"{folder}/{name}"


# ---------------------------------------------------------------------------------------------
# writing: the deterministic YAML every committed record uses (registrations, calibration summaries)
# ---------------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Block style, keys in the order given, no aliases: a stable, readable, diffable file."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _repr_float(dumper: yaml.SafeDumper, value: float) -> yaml.ScalarNode:
    # repr() is the shortest string that reads back as the same float, on every platform.
    if math.isnan(value):
        text = ".nan"
    elif math.isinf(value):
        text = ".inf" if value > 0 else "-.inf"
    else:
        text = repr(float(value))
        if "e" in text and "." not in text.split("e")[0]:
            mant, exp = text.split("e")
            text = f"{mant}.0e{exp}"
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


_Dumper.add_representer(float, _repr_float)


def dump_yaml(data: Any) -> bytes:
    """Deterministic YAML bytes (used for registrations and calibration summaries alike)."""
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
    return text.encode("utf-8")
